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
from ._handlers import ConsoleMetricHandler as ConsoleMetricHandler
from ._handlers import MetricData as MetricData
from ._handlers import MetricHandler as MetricHandler
from ._handlers import NullMetricHandler as NullMetricHandler
from ._prometheus import PrometheusMetricHandler as PrometheusMetricHandler
from ._streams import MetricsConfig as MetricsConfig
from ._streams import MetricStream as MetricStream
from ._streams import configure as configure
from ._streams import get_elapsed_time_ms as get_elapsed_time_ms
from ._streams import getStream as getStream
from ._streams import initialize_metrics as initialize_metrics
from ._streams import prof as prof
from ._streams import profile as profile
from ._streams import publish_metric as publish_metric
from ._streams import put_metric as put_metric

__all__ = (
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "MetricsError",
    "NullMetricHandler",
    "PrometheusMetricHandler",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "initialize_metrics",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
)
