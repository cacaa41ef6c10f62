"""Preemption loses no step: a SIGUSR1 notice (or SIGTERM) to a real ``aelastic run``
persists the newest complete memory step, exits 96, and a fresh start resumes there
with the parameters of a run that was never interrupted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import anyio
import pytest
from _procfs import ignored_signals  # tests/ is on sys.path

from aelastic.launcher._preemption import persisted_step, requeue_argv, trapped_signals
from launcher._nodes import cluster, process_tree

SCRIPT = str(Path(__file__).parent.parent / "checkpoint" / "scripts" / "ckpt_ddp.py")
PREEMPTED = 96  # the contract's value, written out: the test must not read it from the code
HELD_AT = 6


def _lines(out: Path) -> list[dict[str, object]]:
    """The JSON lines rank 0 of ckpt_ddp.py appended to ``out`` when it finished."""
    return [json.loads(line) for line in out.read_text().splitlines()]


def _pids(lines: list[str]) -> list[int]:
    """The workers' pids, from ckpt_ddp.py's ``PID <pid> rank <r>`` lines."""
    return [int(line.split("PID ", 1)[1].split()[0]) for line in lines if "PID " in line]


def _argv(disk: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--standalone",
        "--nproc-per-node",
        "2",
        "--checkpoint-dir",
        str(disk),
        SCRIPT,
        "--out",
        str(out),
        "--steps",
        "12",
        "--every",
        "2",
        *extra,
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The line of a run never interrupted: one run for both signals' tests."""
    tmp = tmp_path_factory.mktemp("uninterrupted")

    async def run() -> None:
        async with cluster() as c:
            node = await c.start(_argv(tmp / "base", tmp / "base.jsonl"))
            with anyio.fail_after(240):
                assert await node.wait() == 0, node.err

    anyio.run(run)
    (whole,) = _lines(tmp / "base.jsonl")
    return whole


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
async def test_a_preempted_job_resumes_at_the_step_its_workers_completed(
    tmp_path: Path, sig: signal.Signals, uninterrupted: dict[str, object]
) -> None:
    disk, out = tmp_path / "ckpt", tmp_path / "out.jsonl"
    async with cluster() as c:
        # --tee 3: each rank's lines reach stdout whole ("[default0]:..."), never interleaved
        held = _argv(disk, out, "--hold-after-save", str(HELD_AT), "--print-pid")
        node = await c.start(["--tee", "3", *held])
        with anyio.fail_after(240):
            # both ranks say they saved step HELD_AT and stopped there: the ground truth
            await node.wait_for_line(lambda line: f":HELD {HELD_AT} rank " in line, count=2)
            # the notice is trapped (--checkpoint-dir): the kernel says the workers ignore it
            pids = _pids(node.lines)
            assert len(pids) == 2 and all(signal.SIGUSR1 in ignored_signals(p) for p in pids)
            if sig == signal.SIGUSR1:  # as Slurm sends it: to every process of the job,
                # the workers first, then the agent
                _agent, *below = process_tree(node.process.pid)
                for pid in below:
                    with contextlib.suppress(ProcessLookupError):  # an idle interpreter
                        os.kill(pid, sig)
            node.process.send_signal(sig)
            assert await node.wait() == PREEMPTED, node.err
        assert f"step {HELD_AT} is in {disk}" in node.err, node.err
        manifest = json.loads((disk / "manifest.json").read_text())
        assert manifest["step"] == HELD_AT and manifest["world_size"] == 2, manifest
        assert not out.exists()  # the interrupted run never finished

        again = await c.start(_argv(disk, out))
        with anyio.fail_after(240):
            assert await again.wait() == 0, again.err
    (resumed,) = _lines(out)
    assert resumed["start"] == HELD_AT and uninterrupted["start"] == 0
    assert resumed["checksum"] == uninterrupted["checksum"]


async def test_without_a_checkpoint_dir_a_sigterm_keeps_torchrun_s_exit(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            [
                "--standalone",
                "--nproc-per-node",
                "1",
                SCRIPT,
                "--out",
                str(tmp_path / "out.jsonl"),
                "--steps",
                "1000000",
                "--print-saves",
                "--print-pid",
            ]
        )
        with anyio.fail_after(120):
            await node.wait_for_line(lambda line: line.startswith("SAVED"))
            # no notice trapped: SIGUSR1 keeps its default action in the worker (torchrun's)
            (pid,) = _pids(node.lines)
            assert signal.SIGUSR1 not in ignored_signals(pid)
            node.process.send_signal(signal.SIGTERM)
            assert await node.wait() == 128 + signal.SIGTERM, node.err


def test_the_notice_is_trapped_only_with_a_checkpoint_dir() -> None:
    usual = [signal.SIGTERM, signal.SIGINT]
    assert trapped_signals(usual, None) == (usual, False)
    assert trapped_signals(usual, "/ckpt") == ([*usual, signal.SIGUSR1], True)
    # listed by the user: torchrun's meaning (forwarded, the job stops), not the notice
    assert trapped_signals([signal.SIGUSR1], "/ckpt") == ([signal.SIGUSR1], False)


def test_only_the_slurm_job_s_node_0_requeues() -> None:
    assert requeue_argv({}) is None
    assert requeue_argv({"SLURM_JOB_ID": "42", "SLURM_NODEID": "0"}) == [
        "scontrol",
        "requeue",
        "42",
    ]
    assert requeue_argv({"SLURM_JOB_ID": "42", "SLURM_NODEID": "1"}) is None
    assert requeue_argv({"SLURM_JOB_ID": "42", "SLURM_PROCID": "3"}) is None
    assert requeue_argv({"SLURM_JOB_ID": "42"}) == ["scontrol", "requeue", "42"]


def test_a_torn_or_missing_manifest_is_no_saved_step(tmp_path: Path) -> None:
    assert persisted_step(None) is None
    assert persisted_step(str(tmp_path)) is None
    (tmp_path / "manifest.json").write_text('{"step": 1')
    assert persisted_step(str(tmp_path)) is None
    (tmp_path / "manifest.json").write_text('{"step": 8, "world_size": 2}')
    assert persisted_step(str(tmp_path)) == 8


def test_requeue_without_a_checkpoint_dir_is_refused_with_the_fix(tmp_path: Path) -> None:
    from aelastic.launcher._args import parse_run_args
    from aelastic.launcher._exceptions import UsageError

    with pytest.raises(UsageError, match="--requeue needs --checkpoint-dir"):
        parse_run_args(["--requeue", "train.py"], {})
    parsed = parse_run_args(["--requeue", "--checkpoint-dir", str(tmp_path), "train.py"], {})
    assert parsed.config.checkpoints.requeue and parsed.config.checkpoints.dir == str(tmp_path)
