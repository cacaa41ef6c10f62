"""A ``MIN:MAX`` job whose nodes all come back after a worker failure does not wait the
last call for a node that is not coming (issue 40 item 5).

Two real ``aelastic run`` processes, ``--nnodes 2:3`` on c10d over loopback. Node A
(the store's host, ticket 0 of round 0) has a 1 s last call so that the first round
completes; node B's is 600 s. B's worker fails once; B rejoins first (A's worker takes
2 s to stop), so B decides the next round: only closing it at once lets the job finish
within the test's bound.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from aelastic.store import TCPStoreClient

from ._nodes import WORKER, cluster, free_port, records


async def test_a_restart_with_every_node_back_skips_the_last_call(tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "out"
    out.mkdir()
    flags = ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", "lastcall", "--max-restarts", "1"]  # fmt: skip
    async with cluster() as c:
        a = await c.start(
            [*flags, "--rdzv-conf", "is_host=1,last_call_timeout=1",
             WORKER, str(out), "--hold-once", str(tmp_path / "held")]
        )  # fmt: skip
        with anyio.fail_after(60):
            # A holds ticket 0 of round 0 before B starts: A's last call decides round 0
            async with TCPStoreClient("127.0.0.1", port, connect_timeout=60) as store:
                await store.wait(["rdzv/lastcall/c/0/joined"], timeout=60)
        b = await c.start(
            [*flags, "--rdzv-conf", "is_host=0,last_call_timeout=600",
             WORKER, str(out), "--fail-first", "1"]
        )  # fmt: skip
        with anyio.fail_after(120):
            assert await b.wait() == 0, b.err
            assert await a.wait() == 0, a.err
    got = sorted((r["TORCHELASTIC_RESTART_COUNT"], r["WORLD_SIZE"]) for r in records(out))
    # A's restart count stays 0: a membership change is not one of its failures
    assert got == [("0", "2"), ("0", "2"), ("0", "2"), ("1", "2")]
    assert "Start the other nodes" not in a.err + b.err
