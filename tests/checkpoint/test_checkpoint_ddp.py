"""Real DDP jobs (gloo) that checkpoint with aelastic.checkpoint and resume after faults."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from agent._shared import LocalRendezvous  # tests/ is on sys.path

from aelastic import CheckpointSettings
from aelastic.agent import LocalElasticAgent, RunResult, WorkerSpec, WorkerState

SCRIPT = str(Path(__file__).parent / "scripts" / "ckpt_ddp.py")


async def run_job(
    tmp_path: Path,
    *args: str,
    max_restarts: int = 1,
    checkpoint_dir: Path | None = None,
    name: str = "out",
) -> tuple[RunResult, list[dict[str, object]]]:
    out = tmp_path / f"{name}.jsonl"
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=LocalRendezvous(),
        entrypoint=sys.executable,
        args=("-u", SCRIPT, "--out", str(out), *args),
        max_restarts=max_restarts,
        shutdown_timeout=5.0,
    )
    disk = None if checkpoint_dir is None else str(checkpoint_dir)
    agent = LocalElasticAgent(spec, checkpoints=CheckpointSettings(dir=disk))
    with anyio.fail_after(100):
        result = await agent.run()
    lines = out.read_text().splitlines() if out.exists() else []
    return result, [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    "fault",
    [
        ("--crash-at-step", "7"),  # rank 0 exits before step 7: step 6 is the newest
        ("--crash-in-save", "8"),  # rank 0 dies writing step 8, which rank 1 completed
        # every step saved asynchronously; rank 0 dies inside the save of step 8
        ("--every", "1", "--async", "--crash-in-save", "8"),
    ],
    ids=["crash", "crash-inside-save", "every-step-async-crash-inside-save"],
)
async def test_crash_resumes_from_the_newest_complete_step_with_equal_params(
    tmp_path: Path, uninterrupted: str, fault: tuple[str, str]
) -> None:
    result, lines = await run_job(tmp_path, *fault)
    assert result.state is WorkerState.SUCCEEDED, result
    start = 7 if "--async" in fault else 6  # the step before the one that crashed
    assert lines == [{"start": start, "attempt": 1, "checksum": uninterrupted}]


async def test_failed_job_leaves_its_step_on_disk_and_a_fresh_launch_resumes(
    tmp_path: Path, uninterrupted: str
) -> None:
    disk = tmp_path / "ckpt"
    result, lines = await run_job(
        tmp_path, "--fail-at-step", "9", max_restarts=0, checkpoint_dir=disk
    )
    assert result.state is WorkerState.FAILED and lines == []
    manifest = json.loads((disk / "manifest.json").read_text())
    assert manifest["step"] == 8 and manifest["world_size"] == 2
    assert sorted(manifest["files"]) == ["0", "1"]
    assert all((disk / f).is_file() for f in manifest["files"].values())
    assert sorted(os.listdir(disk)) == ["manifest.json", "step_000000000008"]  # older removed

    result, lines = await run_job(tmp_path, checkpoint_dir=disk, name="relaunch")
    assert result.state is WorkerState.SUCCEEDED, result
    assert lines == [{"start": 8, "attempt": 0, "checksum": uninterrupted}]
    assert json.loads((disk / "manifest.json").read_text())["step"] == 12
