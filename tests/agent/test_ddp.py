"""Real torch workers (gloo DDP) under the agent; torch is imported only by the workers."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from aelastic.agent import LocalElasticAgent, WorkerSpec, WorkerState

from .conftest import DDP, PYTHON, LocalRendezvous


async def test_ddp_fails_then_restarts_on_the_agent_store(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=LocalRendezvous(),
        entrypoint=PYTHON,
        args=("-u", DDP, "--out", str(out), "--fail-first"),
        max_restarts=1,
        shutdown_timeout=5.0,
        log_dir=str(tmp_path / "logs"),
    )
    agent = LocalElasticAgent(spec)
    with anyio.fail_after(90):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED, result
    (line,) = out.read_text().splitlines()
    assert json.loads(line) == {
        "world_size": 2,
        "sum": 3.0,
        "weights_equal": True,
        "restart_count": 1,
        "agent_store": "True",
    }
