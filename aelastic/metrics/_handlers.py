"""Metric handlers: where data points go (torch elastic's ``MetricHandler`` and its
built-in console and null handlers), and the data point itself."""

from __future__ import annotations

import abc
from typing import NamedTuple

__all__ = ("ConsoleMetricHandler", "MetricData", "MetricHandler", "NullMetricHandler")


class MetricData(NamedTuple):
    """One data point: ``timestamp`` (s since the epoch), group, name and value."""

    timestamp: float
    group_name: str
    name: str
    value: int | float


class MetricHandler(abc.ABC):
    """Emits metric data somewhere: subclass it and implement :meth:`emit`."""

    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None:
        """Record one data point (called on the caller's thread; must not block long)."""


class ConsoleMetricHandler(MetricHandler):
    """Prints ``[timestamp][group]: name=value`` to stdout."""

    def emit(self, metric_data: MetricData) -> None:
        print(
            f"[{metric_data.timestamp}][{metric_data.group_name}]: "
            f"{metric_data.name}={metric_data.value}"
        )


class NullMetricHandler(MetricHandler):
    """Discards every data point (the default handler)."""

    def emit(self, metric_data: MetricData) -> None:
        pass
