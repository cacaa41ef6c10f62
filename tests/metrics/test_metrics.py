"""aelastic.metrics: torch's API, @prof on functions and coroutines, Prometheus export."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

from aelastic import metrics
from aelastic.metrics import _streams
from aelastic.metrics._handlers import ConsoleMetricHandler, MetricData, NullMetricHandler
from aelastic.metrics._prometheus import PrometheusMetricHandler
from aelastic.metrics._streams import (
    MetricsConfig,
    MetricStream,
    get_elapsed_time_ms,
    getStream,
    initialize_metrics,
    profile,
    publish_metric,
)


class Collect(metrics.MetricHandler):
    def __init__(self) -> None:
        self.data: list[MetricData] = []

    def emit(self, metric_data: MetricData) -> None:
        self.data.append(metric_data)

    def values(self) -> dict[str, int | float]:
        return {d.name: d.value for d in self.data}


@pytest.fixture(autouse=True)
def _restore_handlers() -> Iterator[None]:
    default, groups = _streams._default_handler, dict(_streams._metrics_map)
    # Start from torch's defaults whatever earlier tests configured.
    _streams._default_handler = NullMetricHandler()
    _streams._metrics_map.clear()
    yield
    _streams._default_handler = default
    _streams._metrics_map.clear()
    _streams._metrics_map.update(groups)


@pytest.fixture
def collect() -> Collect:
    handler = Collect()
    metrics.configure(handler)
    return handler


def test_default_is_null_and_groups_route(collect: Collect) -> None:
    assert isinstance(_streams._default_handler, metrics.MetricHandler)
    grouped = Collect()
    metrics.configure(grouped, group="agent")
    metrics.put_metric("a", 1)
    metrics.put_metric("b", 2, "agent")
    getStream("agent").add_value("c", 3)
    metrics.put_metric("d", 4, group="agent")
    metrics.put_metric("e", 5, metric_group="agent")
    assert [(d.group_name, d.name, d.value) for d in collect.data] == [("torchelastic", "a", 1)]
    assert [(d.group_name, d.name, d.value) for d in grouped.data] == [
        ("agent", "b", 2),
        ("agent", "c", 3),
        ("agent", "d", 4),
        ("agent", "e", 5),
    ]
    stream = getStream("other")
    assert isinstance(stream, MetricStream) and stream.handler is collect
    assert abs(collect.data[0].timestamp - time.time()) < 60


def test_null_and_console_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    NullMetricHandler().emit(MetricData(1.0, "g", "n", 1))
    metrics.configure(ConsoleMetricHandler(), group="my_app")
    metrics.put_metric("my_metric", 7, "my_app")
    out = capsys.readouterr().out
    assert out.startswith("[") and out.endswith("][my_app]: my_metric=7\n")


def test_configure_rejects_non_handlers() -> None:
    with pytest.raises(TypeError, match="MetricHandler"):
        metrics.configure(print)  # type: ignore[arg-type]


class Agent:
    @metrics.prof
    def rendezvous(self) -> str:
        return "ok"

    @metrics.prof(group="agent")
    async def monitor(self, fail: bool) -> int:
        await anyio.lowlevel.checkpoint()
        if fail:
            raise RuntimeError("worker died")
        return 3


@metrics.prof
def module_level() -> None:
    raise ValueError("bad")


async def test_prof_sync_and_async(collect: Collect) -> None:
    grouped = Collect()
    metrics.configure(grouped, group="agent")
    agent = Agent()
    assert agent.rendezvous() == "ok"
    assert await agent.monitor(False) == 3
    with pytest.raises(RuntimeError):
        await agent.monitor(True)
    with pytest.raises(ValueError):
        module_level()
    assert [d.name for d in collect.data] == [
        "Agent.rendezvous.success", "Agent.rendezvous.duration.ms",
        "test_metrics.module_level.failure", "test_metrics.module_level.duration.ms",
    ]  # fmt: skip
    assert [(d.name, d.value) for d in grouped.data if not d.name.endswith(".ms")] == [
        ("Agent.monitor.success", 1), ("Agent.monitor.failure", 1),
    ]  # fmt: skip
    assert Agent.monitor.__name__ == "monitor"
    import inspect

    assert inspect.iscoroutinefunction(Agent.monitor)


def test_deprecated_aliases(collect: Collect) -> None:
    with pytest.warns(FutureWarning, match="put_metric"):
        publish_metric("torchelastic", "old", 5)
    with pytest.warns(FutureWarning, match="prof"):
        decorator = profile("torchelastic")

    @decorator
    def work() -> int:
        return 1

    assert work() == 1
    assert collect.values()["old"] == 5
    assert collect.values()["work.success"] == 1


def test_helpers() -> None:
    assert 900 <= get_elapsed_time_ms(time.time() - 1) <= 60_000
    assert MetricsConfig().params == {}
    assert MetricsConfig({"a": "b"}).params == {"a": "b"}
    assert initialize_metrics() is None
    assert initialize_metrics(MetricsConfig()) is None
    data = MetricData(1.0, "g", "n", 2)
    assert (data.timestamp, data.group_name, data.name, data.value) == (1.0, "g", "n", 2)


def test_prometheus_handler() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics.configure(PrometheusMetricHandler(registry=registry), group="agent")
    metrics.put_metric("workers.trainer.remaining_restarts", 3, "agent")
    metrics.put_metric("workers.trainer.remaining_restarts", 2, "agent")
    metrics.put_metric("Agent.run.success", 1, "agent")
    metrics.put_metric("Agent.run.success", 1, "agent")
    get = registry.get_sample_value
    assert get("aelastic_workers_trainer_remaining_restarts", {"group": "agent"}) == 2
    assert get("aelastic_Agent_run_success_total", {"group": "agent"}) == 2


def test_prometheus_missing_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(metrics.MetricsError, match=r"pip install 'aelastic\[prometheus\]'"):
        PrometheusMetricHandler()
