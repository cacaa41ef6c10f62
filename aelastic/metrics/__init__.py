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

from ._api import ConsoleMetricHandler as ConsoleMetricHandler
from ._api import MetricData as MetricData
from ._api import MetricHandler as MetricHandler
from ._api import MetricsConfig as MetricsConfig
from ._api import MetricStream as MetricStream
from ._api import NullMetricHandler as NullMetricHandler
from ._api import configure as configure
from ._api import get_elapsed_time_ms as get_elapsed_time_ms
from ._api import getStream as getStream
from ._api import initialize_metrics as initialize_metrics
from ._api import prof as prof
from ._api import profile as profile
from ._api import publish_metric as publish_metric
from ._api import put_metric as put_metric
from ._exceptions import MetricsError as MetricsError
from ._prometheus import PrometheusMetricHandler as PrometheusMetricHandler

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
