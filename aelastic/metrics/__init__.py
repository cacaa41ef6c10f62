"""Metrics of an elastic job, with torch elastic's API.

Example::

    from aelastic import metrics

    class StdoutMetricHandler(metrics.MetricHandler):
        def emit(self, metric_data):
            print(f"[{metric_data.timestamp}][{metric_data.group_name}]: "
                  f"{metric_data.name}={metric_data.value}")

    metrics.configure(StdoutMetricHandler(), group="my_app")
    metrics.put_metric("my_metric", 1, "my_app")

    @metrics.prof(group="my_app")
    async def step() -> None: ...

``PrometheusMetricHandler`` exports to Prometheus (extra ``prometheus``).
"""

from ._exceptions import MetricsError as MetricsError
from ._handlers import MetricHandler as MetricHandler
from ._streams import configure as configure
from ._streams import prof as prof
from ._streams import put_metric as put_metric

__all__ = (
    "MetricHandler",
    "MetricsError",
    "configure",
    "prof",
    "put_metric",
)
