"""Fixtures shared by the checkpoint tests that run ``scripts/ckpt_ddp.py``."""

from __future__ import annotations

import anyio
import pytest

from aelastic.agent import WorkerState


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The checksum of the parameters after a run of ckpt_ddp.py (12 steps, a save every
    2, world 2) without faults: one run for every test that compares against it."""
    from .test_checkpoint_ddp import run_job

    tmp = tmp_path_factory.mktemp("reference")
    result, lines = anyio.run(run_job, tmp)
    assert result.state is WorkerState.SUCCEEDED, result
    assert lines[-1]["start"] == 0
    return str(lines[-1]["checksum"])
