"""What ``aelastic run`` reports when workers fail: every local failure, error files.

Real launcher processes and real workers (``failing_worker.py``); torchrun itself
where the test compares with it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from ._nodes import HERE, WORKER, cluster
from ._summary import summary_block, summary_entries

FAILING = str(HERE / "failing_worker.py")


def _warm_env(warm: bool) -> dict[str, str]:
    return {} if warm else {"AELASTIC_WARM_WORKERS": "0"}


@pytest.mark.parametrize(
    ("record", "warm", "nproc"),
    [("aelastic", True, 2), ("aelastic", False, 2), ("torch", True, 2), ("aelastic", True, 3)],
    ids=["aelastic-record-warm", "aelastic-record-fresh", "torch-record-warm", "three-workers"],
)
async def test_every_worker_that_fails_on_its_own_is_in_the_summary(
    tmp_path: Path, record: str, warm: bool, nproc: int
) -> None:
    if record == "torch":
        pytest.importorskip("torch")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    logs = tmp_path / "logs"
    argv = ["--standalone", "--nproc-per-node", str(nproc), "--log-dir", str(logs)]
    async with cluster() as c:
        node = await c.start(
            [*argv, FAILING, record, "--barrier", str(barrier)], env=_warm_env(warm)
        )
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    _assert_each_has_its_own_error_file(node.err, nproc)


def _assert_each_has_its_own_error_file(stderr: str, nproc: int = 2) -> None:
    block = summary_block(stderr)
    assert "<NO_OTHER_FAILURES>" not in block
    entries = summary_entries(stderr)
    assert sorted(e.local_rank for e in entries) == list(range(nproc)), block
    assert [e.root for e in entries].count(True) == 1
    for entry in entries:
        # Each failure carries its own error file and its own traceback.
        assert Path(entry.error_file).is_file(), block
        assert Path(entry.error_file).parts[-2:] == (str(entry.local_rank), "error.json")
        assert f"RuntimeError: rank {entry.rank} fails on its own" in entry.traceback, block
        assert "Traceback (most recent call last)" in entry.traceback
    assert len({e.error_file for e in entries}) == nproc


async def test_the_root_cause_is_the_first_failure_by_time(tmp_path: Path) -> None:
    """Rank 1 raises first, rank 0 just after (same second): rank 1 is the root cause.

    Which of the two processes exits first is left to chance; the order comes from
    when each wrote its error file.
    """
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    worker = [FAILING, "aelastic", "--barrier", str(barrier), "--first-rank", "1"]
    async with cluster() as c:
        node = await c.start(["--standalone", "--nproc-per-node", "2", *worker])
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    _assert_each_has_its_own_error_file(node.err)
    (root,) = [e for e in summary_entries(node.err) if e.root]
    assert root.rank == 1, summary_block(node.err)


async def test_a_worker_the_agent_stopped_is_not_a_failure(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            ["--standalone", "--nproc-per-node", "2", FAILING, "aelastic", "--only-rank", "1"]
        )
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    assert "<NO_OTHER_FAILURES>" in summary_block(node.err)
    (entry,) = summary_entries(node.err)
    assert (entry.root, entry.rank, entry.exitcode) == (True, 1, 1)
    assert "RuntimeError: rank 1 fails on its own" in entry.traceback


def _torchrun_argv() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run"]


def _without_timestamp(data: dict[str, Any]) -> dict[str, Any]:
    copy = json.loads(json.dumps(data))
    stamp = copy["message"]["extraInfo"].pop("timestamp")
    assert isinstance(stamp, str) and stamp.isdigit()
    return dict(copy)


@pytest.mark.parametrize(
    ("record", "written"), [("aelastic", True), ("none", False)], ids=["record", "plain"]
)
async def test_launcher_error_file_is_what_torchrun_writes(
    tmp_path: Path, record: str, written: bool
) -> None:
    """Same failing worker under both launchers, each with its own TORCHELASTIC_ERROR_FILE."""
    pytest.importorskip("torch")
    ours, theirs = tmp_path / "aelastic.json", tmp_path / "torchrun.json"
    args = ["--standalone", "--nproc-per-node", "1", FAILING, record]
    async with cluster() as c:
        node = await c.start(args, env={"TORCHELASTIC_ERROR_FILE": str(ours)})
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(theirs)}
    with anyio.fail_after(100):
        torchrun = await anyio.run_process([*_torchrun_argv(), *args], env=env, check=False)
    assert torchrun.returncode == 1, torchrun.stderr.decode()
    assert (await anyio.Path(theirs).exists()) is written
    assert (await anyio.Path(ours).exists()) is written
    if written:
        expected = json.loads(await anyio.Path(theirs).read_text())
        got = json.loads(await anyio.Path(ours).read_text())
        assert _without_timestamp(got) == _without_timestamp(expected)
        assert got["message"]["message"] == "RuntimeError: rank 0 fails on its own"
        assert got["message"]["errorCode"] == 1
        # ...and it is the worker's own file, as the summary names it.
        (entry,) = summary_entries(node.err)
        worker_file = json.loads(await anyio.Path(entry.error_file).read_text())
        assert worker_file["message"]["extraInfo"] == got["message"]["extraInfo"]


async def test_launcher_error_file_records_a_handled_signal(tmp_path: Path) -> None:
    ours = tmp_path / "aelastic.json"
    async with cluster() as c:
        node = await c.start(
            ["--standalone", WORKER, str(tmp_path), "--finish-at-world", "9"],
            env={"TORCHELASTIC_ERROR_FILE": str(ours)},
        )
        with anyio.fail_after(60):
            await node.wait_for_line(lambda line: line.startswith("READY"))
            node.process.send_signal(signal.SIGTERM)
            assert await node.wait() == 128 + signal.SIGTERM
    data = json.loads(await anyio.Path(ours).read_text())
    assert data["message"]["message"].startswith("SignalException: ")
    assert "SIGTERM" in data["message"]["message"]
    assert "Traceback" in data["message"]["extraInfo"]["py_callstack"]


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
async def test_run_path_records_an_undecorated_script(tmp_path: Path, warm: bool) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    argv = ["--standalone", "--nproc-per-node", "2", "--run-path", FAILING, "none"]
    async with cluster() as c:
        node = await c.start([*argv, "--barrier", str(barrier)], env=_warm_env(warm))
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    assert "failing_worker.py FAILED" in summary_block(node.err)
    _assert_each_has_its_own_error_file(node.err)


SYS_EXIT = """\
import json, os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as fp:
    json.dump({"argv": sys.argv, "path0": sys.path[0], "name": __name__}, fp)
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize("code", [0, 3])
async def test_run_path_runs_the_script_as_python_would(tmp_path: Path, code: int) -> None:
    script = tmp_path / "scripts" / "exits.py"
    script.parent.mkdir()
    script.write_text(SYS_EXIT)
    out = tmp_path / "out"
    out.mkdir()
    async with cluster() as c:
        node = await c.start(["--standalone", "--run-path", str(script), str(out), str(code)])
        with anyio.fail_after(60):
            assert await node.wait() == (1 if code else 0), node.err
    seen = json.loads((out / "0.json").read_text())
    assert seen == {
        "argv": [str(script), str(out), str(code)],
        "path0": str(script.parent),
        "name": "__main__",
    }
    if code:
        (entry,) = summary_entries(node.err)
        # sys.exit(3) is not an error to record: its exit code is the report.
        assert (entry.exitcode, entry.error_file) == (3, "<N/A>")


def _from_the_script_on(stack: str) -> str:
    """The traceback from the script's frame down (the runner's frames differ)."""
    return stack[stack.index(f'File "{FAILING}"') :]


async def test_run_path_summary_and_error_file_match_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ours, theirs = tmp_path / "aelastic.json", tmp_path / "torchrun.json"
    args = ["--standalone", "--nproc-per-node", "1", "--run-path", FAILING, "none"]
    async with cluster() as c:
        node = await c.start(args, env={"TORCHELASTIC_ERROR_FILE": str(ours)})
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(theirs)}
    with anyio.fail_after(100):
        torchrun = await anyio.run_process([*_torchrun_argv(), *args], env=env, check=False)
    assert torchrun.returncode == 1
    (mine,) = summary_entries(node.err)
    (torch_entry,) = summary_entries(torchrun.stderr.decode())
    assert (mine.rank, mine.exitcode) == (torch_entry.rank, torch_entry.exitcode) == (0, 1)
    assert Path(mine.error_file).name == Path(torch_entry.error_file).name == "error.json"
    assert _from_the_script_on(mine.traceback) == _from_the_script_on(torch_entry.traceback)
    got = json.loads(await anyio.Path(ours).read_text())["message"]
    expected = json.loads(await anyio.Path(theirs).read_text())["message"]
    assert got["message"] == expected["message"] == "RuntimeError: rank 0 fails on its own"
    assert got["errorCode"] == expected["errorCode"] == 1
    assert _from_the_script_on(got["extraInfo"]["py_callstack"]) == _from_the_script_on(
        expected["extraInfo"]["py_callstack"]
    )
