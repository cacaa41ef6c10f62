"""Fixtures shared by the checkpoint tests that run ``scripts/ckpt_ddp.py``."""

from __future__ import annotations

import concurrent.futures

import anyio
import pytest

from aelastic.agent import WorkerState


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The checksum of the parameters after a run of ckpt_ddp.py (12 steps, a save every
    2, world 2) without faults: one run for every test that compares against it."""
    from .test_checkpoint_ddp import run_job

    tmp = tmp_path_factory.mktemp("reference")
    # in a thread of its own: an async test that asks for it first runs in an event loop
    # already (seen running one test file alone)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result, lines = pool.submit(anyio.run, run_job, tmp).result()
    assert result.state is WorkerState.SUCCEEDED, result
    assert lines[-1]["start"] == 0
    return str(lines[-1]["checksum"])
