"""A node frozen (SIGSTOP of its agent, and its store) while the others wait at the exit
barrier: they finish (their workers succeeded) once its silence passed the heartbeat
timeout, not after the barrier's timeout or the rendezvous' close timeout.

The barrier and the close timeouts are 60 s here, the heartbeat timeout 2 s: a node
that waited for either of them would overrun the tests' bounds (30 s).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio

from ._nodes import WORKER, Node, cluster, free_port, process_tree, wait_all
from .test_multinode import _c10d
from .test_silent_node import _at

CONF = (
    "keep_alive_interval=0.5,heartbeat_timeout=2,last_call_timeout=0.5,join_timeout=60,"
    "close_timeout=60"
)
ENV = {"LOGLEVEL": "INFO"}


async def _at_barrier(nodes: list[Node]) -> None:
    with anyio.fail_after(60):
        for n in nodes:
            await n.wait_for_err("waiting up to 60.0 s for other agents")


async def test_frozen_store_host_at_the_exit_barrier_the_others_finish(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "finish"
    argv = _c10d("3", port, "barrierhost", CONF + ",is_host=1")
    async with cluster() as c:
        host = await c.start([*argv, WORKER, str(tmp_path)], env=ENV)
        others = [
            await c.start(
                [
                    *_at(_c10d("3", port, "barrierhost", CONF + ",is_host=0"), addr),
                    *[WORKER, str(tmp_path), "--when-file", str(marker)],
                ],
                env=ENV,
            )
            for addr in ("127.0.0.2", "127.0.0.3")
        ]
        await _at_barrier([host])  # its workers succeeded: it waits for the others
        frozen = process_tree(host.process.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            marker.touch()  # the others' workers succeed: they arrive at a frozen store
            codes = await wait_all(others, 30)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        # Resumed, the host finds its peers gone (their connections closed) and
        # finishes too: its workers had succeeded.
        host_code = await wait_all([host], 30)
    assert codes == [0, 0], [n.err for n in others]
    for n in others:
        assert "left the exit barrier" in n.err and "the rendezvous store is lost" in n.err
        assert f"store at 127.0.0.1:{port} answered nothing" in n.err, n.err
        assert "frozen or hung" in n.err and "finishes without waiting" in n.err
    assert host_code == [0], host.err


async def test_frozen_member_at_the_exit_barrier_the_others_finish(tmp_path: Path) -> None:
    port = free_port()

    def argv(host: bool) -> list[str]:  # node 0 hosts the store, never the victim
        return _c10d("3", port, "barriermember", f"{CONF},is_host={int(host)}")

    async with cluster() as c:
        done = [await c.start([*argv(i == 0), WORKER, str(tmp_path)], env=ENV) for i in range(2)]
        # its worker waits for a file that never comes (at most 60 s)
        victim = await c.start([*argv(False), WORKER, str(tmp_path), "--when-file", "/nonexistent"])
        await _at_barrier(done)
        frozen = process_tree(victim.process.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            codes = await wait_all(done, 30)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
    assert codes == [0, 0], [n.err for n in done]
    host, peer = done
    assert "left the exit barrier" in host.err and "stopped heartbeating" in host.err, host.err
    # The peer notices the same silence, then asks the store whether the rendezvous was
    # closed. The host, which noticed it first, may have finished (taking its store) by
    # then: the peer's reason is then the store's loss. Either way it finishes at once.
    assert "left the exit barrier" in peer.err, peer.err
    assert "stopped heartbeating" in peer.err or "the rendezvous store is lost" in peer.err
