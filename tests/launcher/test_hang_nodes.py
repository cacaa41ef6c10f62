"""Hang detection and restart policy through ``aelastic run``: one node and two nodes."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from ._nodes import HERE, Node, cluster, free_port, wait_all

HANG_WORKER = str(HERE.parent / "agent" / "scripts" / "hang_worker.py")

FAST = (
    "keep_alive_interval=0.2,heartbeat_timeout=1,last_call_timeout=0.5,join_timeout=60,"
    "close_timeout=5"
)


def _glob(directory: Path, pattern: str) -> list[Path]:
    return list(directory.glob(pattern))


def _two_nodes(port: int, run_id: str, conf: str = FAST) -> list[str]:
    return [
        "--nnodes", "2",
        "--nproc-per-node", "1",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", run_id,
        "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1",
        "--exit-barrier-timeout", "60",
    ]  # fmt: skip


async def test_hang_with_no_restart_left_exits_1_saying_hung(tmp_path: Path) -> None:
    argv = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0"]
    argv += ["--heartbeat-timeout", "2", "--section-timeouts", "allreduce=1"]
    argv += ["--log-dir", str(tmp_path), HANG_WORKER, "section", "1"]
    async with cluster() as c:
        node = await c.start(argv)
        (code,) = await wait_all([node], 60)
    assert code == 1, node.err
    assert "hung in section 'allreduce'" in node.err
    (stacks,) = _glob(tmp_path, "*/attempt_0/1/stacks.txt")  # --standalone: a random run id
    assert str(stacks) in node.err
    assert "wait_for_a_peer_that_never_comes" in stacks.read_text()


async def test_bad_section_timeout_is_one_line_exit_2() -> None:
    argv = ["--standalone", "--section-timeouts", "allreduce", HANG_WORKER, "none", "0"]
    async with cluster() as c:
        node = await c.start(argv)
        (code,) = await wait_all([node], 60)
    assert code == 2
    assert "name=seconds" in node.err and "Traceback" not in node.err


async def test_no_progress_stop_exits_93(tmp_path: Path) -> None:
    """Every attempt crashes at step 5: progress once, then 2 attempts without: stop."""
    argv = ["--standalone", "--nproc-per-node", "1", "--max-restarts", "10"]
    argv += ["--max-no-progress-restarts", "2", "--log-dir", str(tmp_path)]
    argv += [HANG_WORKER, "crash-always", "0"]
    async with cluster() as c:
        node = await c.start(argv)
        (code,) = await wait_all([node], 90)
    assert code == 93, node.err
    assert "do not requeue" in node.err
    attempts = sorted(p.name for p in _glob(tmp_path, "*/attempt_*"))
    assert attempts == ["attempt_0", "attempt_1", "attempt_2"]  # not the 10 restarts


async def test_a_rank_hangs_on_one_node_and_both_nodes_restart(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    common = _two_nodes(port, "hang2")
    common += ["--heartbeat-timeout", "2", "--max-restarts", "1"]
    async with cluster() as c:
        hangs = await c.start(
            [*common, "--log-dir", str(tmp_path / "a"), HANG_WORKER, "heartbeat", "0", str(state)]
        )
        healthy = await c.start(
            [*common, "--log-dir", str(tmp_path / "b"), HANG_WORKER, "heartbeat", "-1", str(state)]
        )
        codes = await wait_all([hangs, healthy], 120)
    assert codes == [0, 0], f"A:\n{hangs.err}\nB:\n{healthy.err}"
    # Each agent's own run directory: <log_dir>/<run_id>_<random> (torchrun's layout).
    (stacks,) = _glob(tmp_path / "a", "hang2_*/attempt_0/0/stacks.txt")
    assert "wait_for_a_peer_that_never_comes" in stacks.read_text()
    # The healthy node restarted too (a membership change): it has a second attempt.
    assert len(_glob(tmp_path / "b", "hang2_*/attempt_*")) == 2


@asynccontextmanager
async def _failing_in_turn(tmp_path: Path, run_id: str, *flags: str) -> AsyncIterator[list[Node]]:
    """Two nodes running ``fail-in-turn``: node 0 (the store's host) fails in round 1,
    node 1 in round 2."""
    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    async with cluster() as c:
        nodes = []
        for turn in (0, 1):
            common = _two_nodes(port, run_id, f"{FAST},is_host={int(turn == 0)}")
            worker = [HANG_WORKER, "fail-in-turn", str(turn), str(state)]
            nodes.append(await c.start([*common, *flags, *worker]))
        yield nodes


async def _fail_in_turn(tmp_path: Path, *flags: str) -> list[int]:
    """Node 1 is the one that may close the rendezvous (the host closing it is
    ``test_a_store_host_that_fails_for_good_takes_its_peer_down_at_once``)."""
    async with _failing_in_turn(tmp_path, "budget", "--max-restarts", "1", *flags) as nodes:
        return await wait_all(nodes, 120)


async def test_job_wide_budget_counts_failures_of_every_node(tmp_path: Path) -> None:
    """Node 0 fails in round 1, node 1 in round 2: 2 failures against a budget of 1."""
    codes = await _fail_in_turn(tmp_path, "--job-wide-restarts")
    assert codes == [1, 1]
    assert len(list((tmp_path / "state").glob("failed_*"))) == 2


async def test_per_node_budget_is_torchruns_default(tmp_path: Path) -> None:
    """The same failures without the flag: each node spends its own one restart; job done."""
    codes = await _fail_in_turn(tmp_path)
    assert codes == [0, 0]


async def test_a_store_host_that_fails_for_good_takes_its_peer_down_at_once(
    tmp_path: Path,
) -> None:
    """The store's host (node 0) fails with no restart left and closes the rendezvous;
    its store goes with it. Node 1, healthy, must exit 1 (rendezvous closed) at once,
    not re-host the store as heir without ``closed`` and wait out join_timeout (60 s)."""
    async with _failing_in_turn(tmp_path, "closer", "--max-restarts", "0") as nodes:
        (host_code,) = await wait_all(nodes[:1], 60)
        with anyio.fail_after(15):  # join_timeout is 60 s
            survivor_code = await nodes[1].wait()
    assert (host_code, survivor_code) == (1, 1), nodes[1].err
    assert "rendezvous 'closer' is closed" in nodes[1].err, nodes[1].err
    assert "lost; this node hosts its successor" not in nodes[1].err, nodes[1].err


async def test_learned_timeouts_are_shared_through_the_store(tmp_path: Path) -> None:
    """Node 0's 0.3 s heartbeat intervals (round 1) set node 1's learned timeout (x5),
    which then catches node 1's hang in round 2 long before the configured 30 s."""
    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    common = _two_nodes(port, "learn2")
    common += ["--heartbeat-timeout", "30", "--learn-timeouts", "5", "--max-restarts", "1"]
    async with cluster() as c:
        nodes = []
        for n in (0, 1):
            worker = [HANG_WORKER, "learn-shared", str(n), str(state)]
            nodes.append(await c.start([*common, "--log-dir", str(tmp_path / str(n)), *worker]))
        codes = await wait_all(nodes, 120)
    assert codes == [0, 0], f"0:\n{nodes[0].err}\n1:\n{nodes[1].err}"
    learned = json.loads((tmp_path / "1" / "learn2" / "learned_timeouts.json").read_text())
    assert learned["heartbeat"] >= 0.3  # node 1's own workers never waited that long
    found = re.search(r"hung outside any section: no heartbeat for ([0-9.]+) s", nodes[1].err)
    assert found, nodes[1].err
    assert float(found.group(1)) == pytest.approx(5 * learned["heartbeat"], rel=1e-3)
    assert float(found.group(1)) < 30


async def test_no_progress_stop_leaves_the_error_file_for_the_scheduler(tmp_path: Path) -> None:
    """As for any failed job, the failed worker's error file is copied to the launcher's
    TORCHELASTIC_ERROR_FILE (what a scheduler reads) when the no-progress rule stops it."""
    worker = tmp_path / "crash_at_step_5.py"
    worker.write_text(
        "from aelastic.errors import record\n"
        "from aelastic.progress import step\n"
        "@record\n"
        "def main():\n"
        "    step(5)\n"
        "    raise RuntimeError('diverged at step 5')\n"
        "main()\n"
    )
    error_file = tmp_path / "launcher_error.json"
    argv = ["--standalone", "--nproc-per-node", "1", "--max-restarts", "10"]
    argv += ["--max-no-progress-restarts", "2", "--log-dir", str(tmp_path / "logs"), str(worker)]
    async with cluster() as c:
        node = await c.start(argv, {"TORCHELASTIC_ERROR_FILE": str(error_file)})
        (code,) = await wait_all([node], 90)
    assert code == 93, node.err
    assert "diverged at step 5" in error_file.read_text()
