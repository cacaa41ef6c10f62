"""Metric streams: torch elastic's API for sending a data point to its group's handler
(``configure``, ``getStream``, ``put_metric``, ``@prof``).

Handlers are synchronous and called on the caller's path, as in torch; keep them cheap
(the default :class:`~aelastic.metrics._handlers.NullMetricHandler` does nothing). ``@prof`` also
profiles coroutine functions, timing the awaited call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from ._handlers import MetricData, MetricHandler, NullMetricHandler

__all__ = (
    "MetricStream",
    "MetricsConfig",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "initialize_metrics",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
)

F = TypeVar("F", bound=Callable[..., Any])


class MetricsConfig:
    """Metrics configuration: free-form string parameters (``params``)."""

    __slots__ = ("params",)

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params: dict[str, str] = {} if params is None else params


class MetricStream:
    """The metrics of one group, sent to one handler."""

    __slots__ = ("group_name", "handler")

    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: int | float) -> None:
        """Emit ``metric_name=metric_value`` now."""
        self.handler.emit(MetricData(time.time(), self.group_name, metric_name, metric_value))


_lock = threading.Lock()
_metrics_map: dict[str, MetricHandler] = {}
_default_handler: MetricHandler = NullMetricHandler()


def configure(handler: MetricHandler, group: str | None = None) -> None:
    """Send the metrics of ``group`` to ``handler``; ``group=None`` sets the default handler."""
    global _default_handler
    if not isinstance(handler, MetricHandler):
        raise TypeError(
            f"configure() needs a MetricHandler (subclass it and implement emit()), got {handler!r}"
        )
    with _lock:
        if group is None:
            _default_handler = handler
        else:
            _metrics_map[group] = handler


def getStream(group: str) -> MetricStream:  # torch's name
    """Return the :class:`MetricStream` of ``group`` (its handler, or the default one)."""
    return MetricStream(group, _metrics_map.get(group, _default_handler))


def put_metric(
    metric_name: str,
    metric_value: int | float,
    metric_group: str = "torchelastic",
    *,
    group: str | None = None,
) -> None:
    """Publish one data point: ``put_metric("workers.trainer.remaining_restarts", 3)``.

    The group is ``metric_group`` (torch's parameter name) or its alias ``group=``.
    """
    if group is not None:
        metric_group = group
    _metrics_map.get(metric_group, _default_handler).emit(
        MetricData(time.time(), metric_group, metric_name, metric_value)
    )


def publish_metric(metric_group: str, metric_name: str, metric_value: int | float) -> None:
    """Deprecated: use ``put_metric(metric_name, metric_value, metric_group)``."""
    warnings.warn(
        "publish_metric is deprecated, use put_metric(name, value, group)",
        FutureWarning,
        stacklevel=2,
    )
    put_metric(metric_name, metric_value, metric_group)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Return the milliseconds elapsed since ``start_time_in_seconds`` (``time.time()``)."""
    return int((time.time() - start_time_in_seconds) * 1000)


def _metric_name(fn: Callable[..., Any]) -> str:
    qualname: str = fn.__qualname__
    if "." in qualname:
        return qualname
    module = getattr(fn, "__module__", None)
    return f"{module.rsplit('.', 1)[-1]}.{qualname}" if module else qualname


@contextlib.contextmanager
def _measured(key: str, group: str) -> Iterator[None]:
    """Put ``<key>.success`` or ``<key>.failure`` (an Exception) and ``<key>.duration.ms``."""
    start = time.time()
    try:
        yield
    except Exception:
        put_metric(f"{key}.failure", 1, group)
        raise
    else:
        put_metric(f"{key}.success", 1, group)
    finally:
        put_metric(f"{key}.duration.ms", get_elapsed_time_ms(start), group)


def _profiled(fn: F, key: str, group: str) -> F:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with _measured(key, group):
                return await fn(*args, **kwargs)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _measured(key, group):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@overload
def prof(fn: F, group: str = ...) -> F: ...
@overload
def prof(fn: None = ..., group: str = ...) -> Callable[[F], F]: ...
def prof(fn: F | None = None, group: str = "torchelastic") -> F | Callable[[F], F]:
    """Publish ``<name>.success``/``.failure`` (value 1) and ``<name>.duration.ms``.

    ``<name>`` is the function's ``__qualname__`` (``Class.method``), or
    ``<leaf module>.<function>`` for a module-level function. Works on plain and
    ``async def`` functions (the coroutine's awaited duration is measured; a cancelled
    coroutine reports only its duration). ``@prof`` and ``@prof(group="agent")``.
    """

    def wrap(f: F) -> F:
        return _profiled(f, _metric_name(f), group)

    return wrap(fn) if fn is not None else wrap


def profile(group: str | None = None) -> Callable[[F], F]:
    """Deprecated: use :func:`prof`. Names metrics ``<function __name__>.*``."""
    warnings.warn("profile is deprecated, use @prof", FutureWarning, stacklevel=2)

    def wrap(f: F) -> F:
        return _profiled(f, f.__name__, group or "torchelastic")

    return wrap


def initialize_metrics(cfg: MetricsConfig | None = None) -> None:
    """Initialise metrics from ``cfg``; a no-op (as in torch's open-source build)."""
