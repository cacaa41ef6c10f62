"""The agent's events (torch's ``_construct_event``) and metrics (``_record_metrics``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aelastic import events, metrics
from aelastic.agent import LocalElasticAgent, WorkerSpec, WorkerState
from aelastic.events._dispatch import flush, unregister_handler
from aelastic.metrics._handlers import MetricData, NullMetricHandler

from .conftest import PYTHON, LocalRendezvous, open_reporter


class _Collect(metrics.MetricHandler):
    def __init__(self) -> None:
        self.data: list[MetricData] = []

    def emit(self, metric_data: MetricData) -> None:
        self.data.append(metric_data)


@pytest.fixture
def collected() -> Iterator[_Collect]:
    handler = _Collect()
    metrics.configure(handler, "torchelastic")
    yield handler
    metrics.configure(NullMetricHandler(), "torchelastic")


async def test_events_and_metrics_of_a_run_with_one_restart(
    tmp_path: Path, collected: _Collect
) -> None:
    received: list[events.Event] = []
    events.register_handler("agent-test", received.append)
    try:
        async with open_reporter() as rep:
            spec = WorkerSpec(
                role="trainer",
                local_world_size=2,
                rdzv_handler=LocalRendezvous(),
                entrypoint=PYTHON,
                args=rep.args("fail-first"),
                max_restarts=3,
                log_dir=str(tmp_path),
                event_log_handler="agent-test",
            )
            agent = LocalElasticAgent(spec)
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent.run)
                for r in await rep.next_of_attempt(1):
                    await r.send(0)
        await flush(["agent-test"])
    finally:
        unregister_handler("agent-test", received.append)
    assert agent.get_worker_group().state is WorkerState.SUCCEEDED
    names = [e.name.rsplit(".", 1)[-1] for e in received]
    assert names.count("RENDEZVOUS") == 2 and names.count("ASSIGN_WORKER_RANKS") == 2
    assert names.count("START") == 4 and names[-2:] == ["SUCCEEDED", "SUCCEEDED"]
    done = received[-1]
    assert done.source is events.EventSource.WORKER
    md = done.metadata
    assert md["run_id"] == "test-run" and md["role"] == "trainer" and md["state"] == "SUCCEEDED"
    assert md["rdzv_backend"] == "local-test" and md["agent_restarts"] == 1
    assert md["group_rank"] == 0 and md["global_rank"] in (0, 1)
    inner = json.loads(str(md["metadata"]))
    assert inner["group_world_size"] == 1 and inner["entry_point"] == Path(PYTHON).name
    assert inner["local_rank"] == [md["global_rank"]]
    rdzv = next(e for e in received if e.name.endswith("RENDEZVOUS"))
    assert rdzv.source is events.EventSource.AGENT and rdzv.metadata["duration_ms"] is not None
    # the run's goodput ledger, before the workers' final statuses
    ledger = next(e.metadata for e in received if e.name == "aelastic.goodput")
    badput = {k: v for k, v in ledger.items() if k.startswith("badput.")}
    assert float(ledger["productive_s"]) + sum(map(float, badput.values())) == pytest.approx(  # type: ignore[arg-type]
        ledger["wall_s"], abs=0.01
    )
    assert float(ledger["badput.restart.crash"]) > 0  # type: ignore[arg-type]
    assert str(ledger["summary"]).startswith("goodput ")

    values = {m.name: m.value for m in collected.data}
    assert values["workers.trainer.run_total"] == 1
    assert values["workers.trainer.run_success_with_retries"] == 1
    assert values["workers.trainer.run_success_no_retries"] == 0
    assert values["workers.trainer.run_failed_with_retries"] == 0
    assert values["workers.trainer.flakiness"] == 25  # 1 of 3 restarts spent
    assert values["workers.trainer.remaining_restarts"] == 2
    assert values["workers.trainer.SUCCEEDED"] == 1
    assert values["SimpleElasticAgent._rendezvous.success"] == 1
    assert "LocalElasticAgent._start_workers.duration.ms" in values
