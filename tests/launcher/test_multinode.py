"""Several ``aelastic run`` processes as nodes of one job on 127.0.0.1 (c10d rendezvous).

The workers are a tiny non-torch script (node_worker.py): rendezvous and membership are
the point here, not collectives.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio

from ._nodes import WORKER, Node, cluster, free_port, records, wait_all

# close_timeout bounds a node's leave when the store's host has already gone (that leave
# can otherwise wait the full default 30 s: DynamicRendezvousHandler._dissolve on a
# client node blocks until close_timeout once the host's store is closed).
FAST = (
    "keep_alive_interval=0.2,heartbeat_timeout=1,last_call_timeout=0.5,join_timeout=60,"
    "close_timeout=5"
)


def _c10d(nnodes: str, port: int, run_id: str, conf: str = FAST) -> list[str]:
    return [
        "--nnodes", nnodes,
        "--nproc-per-node", "1",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", run_id,
        "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1",
        "--exit-barrier-timeout", "60",
    ]  # fmt: skip


def _ready(world: int) -> object:
    return lambda line: line.startswith("READY") and line.split("world=")[1].strip() == str(world)


async def test_three_nodes_form_one_world(tmp_path: Path) -> None:
    port = free_port()
    argv = ["--nnodes", "3", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    argv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "three"]
    argv += ["--rdzv-conf", "close_timeout=5", WORKER, str(tmp_path)]
    async with cluster() as c:
        nodes = [await c.start(argv) for _ in range(3)]
        codes = await wait_all(nodes, 90)
    assert codes == [0, 0, 0], [n.err for n in nodes]
    recs = records(tmp_path)
    assert sorted(int(r["RANK"]) for r in recs) == list(range(6))
    assert {r["WORLD_SIZE"] for r in recs} == {"6"}
    assert {r["GROUP_WORLD_SIZE"] for r in recs} == {"3"}
    assert sorted(r["GROUP_RANK"] for r in recs) == ["0", "0", "1", "1", "2", "2"]
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1


async def test_late_node_scales_the_world_up(tmp_path: Path) -> None:
    port = free_port()
    # The round after the late node's join closes at 3 nodes at once; a last call of
    # 0.5 s could close it at 2 (one first node and the late one) when the other first
    # node takes longer than that to stop its worker and rejoin on a loaded machine
    # (seen in a full-suite run: worlds 2, 2, then 2 again, then 3).
    conf = FAST.replace("last_call_timeout=0.5", "last_call_timeout=3")
    argv = [*_c10d("2:3", port, "grow", conf), WORKER, str(tmp_path), "--finish-at-world", "3"]
    async with cluster() as c:
        first = [await c.start(argv) for _ in range(2)]
        with anyio.fail_after(60):
            for node in first:
                await node.wait_for_line(_ready(2))
        late = await c.start(argv)
        codes = await wait_all([*first, late], 60)
    assert codes == [0, 0, 0], [n.err for n in c.nodes]
    recs = records(tmp_path)
    worlds = [r["WORLD_SIZE"] for r in recs]
    assert worlds.count("2") == 2 and worlds.count("3") == 3
    assert sorted(r["RANK"] for r in recs if r["WORLD_SIZE"] == "3") == ["0", "1", "2"]
    # a membership change is not a failure: the restart budget is untouched
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}


async def test_killed_node_is_dropped_and_the_others_finish(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "killed"
    out = tmp_path / "out"
    out.mkdir()
    conf = FAST.replace("last_call_timeout=0.5", "last_call_timeout=2")
    tail = [WORKER, str(out), "--finish-at-world", "2", "--when-file", str(marker)]
    # is_host pins which node hosts the rendezvous store (the one that must survive)
    host_argv = [*_c10d("2:3", port, "shrink", conf + ",is_host=1"), *tail]
    argv = [*_c10d("2:3", port, "shrink", conf + ",is_host=0"), *tail]
    async with cluster() as c:
        host = await c.start(host_argv, env={"LOGLEVEL": "INFO"})
        others = [await c.start(argv, env={"LOGLEVEL": "INFO"}) for _ in range(2)]
        with anyio.fail_after(60):
            for node in [host, *others]:
                await node.wait_for_line(_ready(3))
        victim = others[-1]
        os.kill(victim.process.pid, signal.SIGKILL)
        marker.touch()
        codes = await wait_all([host, others[0]], 30)
        assert await victim.wait() == -signal.SIGKILL
    assert codes == [0, 0], [n.err for n in c.nodes]
    recs = records(out)
    finals = [r for r in recs if r["WORLD_SIZE"] == "2"]
    assert sorted(r["RANK"] for r in finals) == ["0", "1"]


#: What a worker does on attempt 0 before it fails: write its error file (as ``@record``
#: does when the script raises), then what the test appends; later attempts succeed.
_FAIL_ON_ATTEMPT_0 = (
    '[ "$TORCHELASTIC_RESTART_COUNT" != 0 ] && exit 0; '
    'echo \'{"message": {"message": "boom", "extraInfo": '
    '{"py_callstack": "", "timestamp": "0"}}}\' > "$TORCHELASTIC_ERROR_FILE"; '
)


async def _two_nodes_failing_once(run_id: str, then: str) -> list[Node]:
    """Two ``--nnodes 2 --max-restarts 1`` nodes whose workers run ``sh -c`` with
    :data:`_FAIL_ON_ATTEMPT_0` + ``then``; both must finish with 0 within 60 s."""
    argv = [*_c10d("2", free_port(), run_id), "--max-restarts", "1", "--no-python", "sh", "-c"]
    argv += [_FAIL_ON_ATTEMPT_0 + then]
    async with cluster() as c:
        nodes = [await c.start(argv, env={"LOGLEVEL": "INFO"}) for _ in range(2)]
        codes = await wait_all(nodes, 60)
    assert codes == [0, 0], [n.err for n in nodes]
    return nodes


async def test_both_nodes_fail_at_once_and_both_restart(tmp_path: Path) -> None:
    # Every worker of both nodes fails on the first attempt, within milliseconds of each
    # other: both nodes must spend one restart, meet in the next round and finish. Each
    # worker marks itself up and exits 1 once its peer's mark exists too. A node that
    # hears of the other's failure first must still count its own worker's failure
    # (already exited, or its error file written), not restart it for free as a
    # membership change.
    up = tmp_path / "up"
    up.mkdir()
    both_up = f"until [ -e {up}/0 ] && [ -e {up}/1 ]; do :; done"
    await _two_nodes_failing_once("bothfail", f"touch {up}/$GROUP_RANK; {both_up}; exit 1")


async def test_a_failed_worker_still_tearing_down_spends_a_restart(tmp_path: Path) -> None:
    # Node rank 1's worker has failed (its error file is written) but is still running
    # when node rank 0's worker exits 1. Node 1 hears of it as a membership change; its
    # own worker's failure must still count: it spends a restart (the next attempt sees
    # TORCHELASTIC_RESTART_COUNT=1) instead of restarting for free into the same
    # failure (here: an attempt 0 that never ends).
    failed = tmp_path / "failed"
    nodes = await _two_nodes_failing_once(
        "tearing",
        f'if [ "$GROUP_RANK" = 1 ]; then touch {failed}; exec sleep 600; fi; '
        f"until [ -e {failed} ]; do :; done; exit 1",
    )
    for node in nodes:
        assert "restart_count=1" in node.err, node.err
    # node 1's log names its own failure, not "no exit"
    assert any("worker group FAILED (local_rank 0 exited -15)" in n.err for n in nodes), [
        n.err for n in nodes
    ]
