"""Callable entrypoints: run in a spawned interpreter, return values by global rank."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from aelastic.agent import LocalElasticAgent, RunResult, WorkerSpec, WorkerState

from .conftest import LocalRendezvous


def square_rank(offset: int) -> dict[str, int]:
    rank = int(os.environ["RANK"])
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and rank == 1:
        raise RuntimeError("first attempt of rank 1 fails")
    return {"rank": rank, "value": rank * rank + offset}


def _python_path() -> str:
    # The worker imports this module by name: give it the same sys.path root.
    root = next(p for p in sys.path if Path(p, *__name__.split(".")[:-1]).is_dir())
    return os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])


async def _run(
    tmp_path: Path, offset: int, max_restarts: int
) -> tuple[LocalElasticAgent, RunResult]:
    spec = WorkerSpec(
        role="fn",
        local_world_size=2,
        rdzv_handler=LocalRendezvous(),
        entrypoint=square_rank,
        args=(offset,),
        max_restarts=max_restarts,
        log_dir=str(tmp_path),
    )
    agent = LocalElasticAgent(spec, worker_env_extra={"PYTHONPATH": _python_path()})
    with anyio.fail_after(60):
        return agent, await agent.run()


async def test_callable_entrypoint_returns_values_by_global_rank(tmp_path: Path) -> None:
    agent, result = await _run(tmp_path, offset=10, max_restarts=1)
    assert result.state is WorkerState.SUCCEEDED, result
    assert result.return_values == {0: {"rank": 0, "value": 10}, 1: {"rank": 1, "value": 11}}
    assert agent.remaining_restarts == 0


async def test_callable_failure_reports_error_file(tmp_path: Path) -> None:
    _, result = await _run(tmp_path, offset=0, max_restarts=0)
    assert result.is_failed()
    failure = result.failures[1]
    assert str(failure.error_file).endswith("error.json")
    assert "first attempt of rank 1 fails" in str(failure.message)
