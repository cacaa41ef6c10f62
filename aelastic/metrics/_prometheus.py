"""A metric handler exporting to Prometheus (optional: ``pip install 'aelastic[prometheus]'``).

``prometheus_client`` is imported when the handler is created, never at import time.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ._exceptions import MetricsError
from ._handlers import MetricData, MetricHandler

__all__ = ("PrometheusMetricHandler",)

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


class PrometheusMetricHandler(MetricHandler):
    """Export each metric as a Prometheus series labelled with its group.

    ``<name>.success`` and ``<name>.failure`` (``@prof``'s outcomes) become counters
    (``<namespace>_<name>_success_total``); every other metric a gauge holding the last
    value. Names are sanitised (``.`` and other invalid characters become ``_``).
    Series go to ``registry`` (default: prometheus_client's global ``REGISTRY``); serve
    them with ``prometheus_client.start_http_server`` or your own exporter.
    """

    def __init__(self, registry: Any = None, namespace: str = "aelastic") -> None:
        try:
            import prometheus_client
        except ImportError:
            raise MetricsError(
                "PrometheusMetricHandler needs prometheus-client: "
                "pip install 'aelastic[prometheus]'"
            ) from None
        self._client = prometheus_client
        self._registry = registry if registry is not None else prometheus_client.REGISTRY
        self._namespace = namespace
        self._series: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _get(self, name: str) -> tuple[Any, bool]:
        counter = name.endswith((".success", ".failure"))
        series = self._series.get(name)
        if series is None:
            with self._lock:
                series = self._series.get(name)
                if series is None:
                    kind = self._client.Counter if counter else self._client.Gauge
                    series = kind(
                        _INVALID.sub("_", name),
                        f"aelastic metric {name}",
                        ["group"],
                        namespace=self._namespace,
                        registry=self._registry,
                    )
                    self._series[name] = series
        return series, counter

    def emit(self, metric_data: MetricData) -> None:
        series, counter = self._get(metric_data.name)
        child = series.labels(group=metric_data.group_name)
        if counter:
            child.inc(metric_data.value)
        else:
            child.set(metric_data.value)
