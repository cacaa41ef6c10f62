"""Three ``aelastic run`` nodes; the one hosting the c10d store is SIGKILLed (issue 13).

The round's heir re-hosts the rendezvous store and the two survivors finish the job
in a world of 2 (before: the whole job failed with the host).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio

from ._nodes import WORKER, cluster, free_port, records, wait_all
from .test_multinode import FAST, _c10d, _ready


async def test_store_host_killed_survivors_finish_with_two(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "killed"
    out = tmp_path / "out"
    out.mkdir()
    # Slow heartbeats (30 s): only the store-connection liveness and the heir's new
    # store let the survivors finish within the bound.
    conf = FAST.replace("heartbeat_timeout=1", "heartbeat_timeout=30")
    conf = conf.replace("last_call_timeout=0.5", "last_call_timeout=2")
    tail = [WORKER, str(out), "--finish-at-world", "2", "--when-file", str(marker)]
    host_argv = [*_c10d("2:3", port, "hostloss", conf + ",is_host=1"), *tail]
    argv = [*_c10d("2:3", port, "hostloss", conf + ",is_host=0"), *tail]
    async with cluster() as c:
        host = await c.start(host_argv, env={"LOGLEVEL": "INFO"})
        others = [await c.start(argv, env={"LOGLEVEL": "INFO"}) for _ in range(2)]
        with anyio.fail_after(60):
            for node in [host, *others]:
                await node.wait_for_line(_ready(3))
        os.kill(host.process.pid, signal.SIGKILL)
        marker.touch()
        codes = await wait_all(others, 25)
        assert await host.wait() == -signal.SIGKILL
    assert codes == [0, 0], [n.err for n in c.nodes]
    finals = [r for r in records(out) if r["WORLD_SIZE"] == "2"]
    assert sorted(r["RANK"] for r in finals) == ["0", "1"]
    # The heir says where the rendezvous went (new nodes' endpoint); on one machine it
    # re-hosts the same address and port, so the other survivor just reconnects.
    moved = f"new nodes use --rdzv-endpoint 127.0.0.1:{port}"
    assert any(moved in n.err for n in others), "\n=====\n".join(n.err for n in others)
