"""``--nnodes N`` with the static rendezvous (no rendezvous flags): the wait for the other
nodes is announced up front and ends in one clear error (issue 10 item 8)."""

from __future__ import annotations

from pathlib import Path

import anyio

from ._nodes import WORKER, cluster, free_port, records, wait_all


async def test_missing_node_is_named_up_front_and_at_the_timeout(tmp_path: Path) -> None:
    port = free_port()
    argv = ["--nnodes", "2", "--master-port", str(port), "--rdzv-conf", "timeout=2"]
    async with cluster() as c:
        node = await c.start([*argv, WORKER, str(tmp_path)])
        with anyio.fail_after(60):
            await node.wait_for_err("waiting up to 2 s for node rank 1")
        [code] = await wait_all([node], 60)
    err = node.err
    assert code == 1, err
    notice, _, error = err.partition("aelastic run: error: ")
    # Up front: joined of needed, the wait, the missing rank and the flags that fix it.
    for text in ("1 of 2 nodes joined", "node rank 1", "--node-rank", "--master-addr"):
        assert text in notice, err
    assert f"--master-port {port}" in notice and "--rdzv-backend c10d" in notice, err
    # At the timeout: one line saying the same, no store key, no traceback.
    assert error.count("\n") == 1, err
    assert "only 1 of 2 nodes joined within timeout=2s; node rank 1 never came" in error
    assert "rdzv/" not in err and "torchelastic/" not in err and "Traceback" not in err
    assert records(tmp_path) == []  # no worker started


async def test_node_that_comes_later_completes_the_world(tmp_path: Path) -> None:
    port = free_port()
    base = ["--nnodes", "2", "--master-port", str(port), "--rdzv-conf", "timeout=60"]
    async with cluster() as c:
        first = await c.start([*base, WORKER, str(tmp_path)])
        with anyio.fail_after(60):
            await first.wait_for_err("1 of 2 nodes joined")
        second = await c.start([*base, "--node-rank", "1", WORKER, str(tmp_path)])
        codes = await wait_all([first, second], 60)
    assert codes == [0, 0], [first.err, second.err]
    recs = records(tmp_path)
    assert sorted(r["RANK"] for r in recs) == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in recs} == {"2"}
    assert "waiting" not in second.err  # node rank 0 was already there


async def test_node_without_rank_0_says_so_up_front(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: node rank 0 was never started
    argv = ["--nnodes", "2", "--node-rank", "1", "--master-port", str(port)]
    async with cluster() as c:
        node = await c.start([*argv, "--rdzv-conf", "timeout=2", WORKER, str(tmp_path)])
        with anyio.fail_after(60):
            await node.wait_for_err("node rank 0 does not host the store")
        [code] = await wait_all([node], 60)
    err = node.err
    assert code == 1, err
    notice, _, error = err.partition("aelastic run: error: ")
    assert f"127.0.0.1:{port} yet; waiting up to 2 s" in notice, err
    assert "--rdzv-backend c10d" in notice, err
    assert "node rank 0" in error and "Traceback" not in err, err
    assert records(tmp_path) == []
