"""A whole node frozen (SIGSTOP of its agent and workers) during training: the others
form a new world within the heartbeat timeout (+ last call), and the node, resumed,
stops its stale workers and rejoins as a new member without a duplicate rank."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio

from ._nodes import WORKER, Node, cluster, free_port, process_tree, wait_all
from .test_multinode import _c10d

HEARTBEAT, LAST_CALL = 2.0, 0.5
CONF = (
    f"keep_alive_interval=0.5,heartbeat_timeout={HEARTBEAT},last_call_timeout={LAST_CALL},"
    "join_timeout=60,close_timeout=5"
)


def _ready(world: int) -> object:
    return lambda line: line.startswith("READY") and line.endswith(f"world={world}")


def _last_rank(node: Node) -> str:
    return [line for line in node.lines if line.startswith("READY")][-1].split()[1]


async def test_frozen_member_is_replaced_and_rejoins_when_resumed(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "finish"
    tail = [WORKER, str(tmp_path), "--finish-at-world", "3", "--when-file", str(marker)]
    async with cluster() as c:
        host = await c.start([*_c10d("2:3", port, "frozen", CONF + ",is_host=1"), *tail])
        a = await c.start([*_c10d("2:3", port, "frozen", CONF + ",is_host=0"), *tail])
        victim = await c.start([*_c10d("2:3", port, "frozen", CONF + ",is_host=0"), *tail])
        nodes = [host, a, victim]
        with anyio.fail_after(60):
            for n in nodes:
                await n.wait_for_line(_ready(3))
        frozen = process_tree(victim.process.pid)
        assert len(frozen) >= 2  # the agent and its worker
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            with anyio.fail_after(60):
                for n in (host, a):
                    await n.wait_for_line(_ready(2))
            formed = max(n.line_times[n.lines.index(next(filter(_ready(2), n.lines)))]
                         for n in (host, a)) - stopped_at  # fmt: skip
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        # generous: the workers' restart and the machine's load come on top
        assert formed < 2 * HEARTBEAT + LAST_CALL + 3, formed
        with anyio.fail_after(60):
            for n in (host, a):
                await n.wait_for_line(_ready(3), count=2)
            await victim.wait_for_line(_ready(3), count=2)
        marker.touch()
        codes = await wait_all(nodes, 60)
    assert codes == [0, 0, 0], [n.err for n in nodes]
    assert sorted(_last_rank(n) for n in nodes) == ["rank=0", "rank=1", "rank=2"]


def _at(argv: list[str], addr: str) -> list[str]:
    """``argv`` with this node's own loopback address (the heir re-hosts the store at
    its address while the frozen host still holds the port at 127.0.0.1)."""
    i = argv.index("--local-addr")
    return [*argv[: i + 1], addr, *argv[i + 2 :]]


async def test_frozen_store_host_is_replaced_and_stops_when_resumed(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "finish"
    tail = [WORKER, str(tmp_path), "--finish-at-world", "2", "--when-file", str(marker)]
    env = {"LOGLEVEL": "INFO"}
    async with cluster() as c:
        host = await c.start([*_c10d("2:3", port, "frozenhost", CONF + ",is_host=1"), *tail])
        others = [
            await c.start(
                [*_at(_c10d("2:3", port, "frozenhost", CONF + ",is_host=0"), addr), *tail], env=env
            )
            for addr in ("127.0.0.2", "127.0.0.3")
        ]
        with anyio.fail_after(60):
            for n in (host, *others):
                await n.wait_for_line(_ready(3))
        frozen = process_tree(host.process.pid)
        assert len(frozen) >= 2  # the agent (and its store) and its worker
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            with anyio.fail_after(60):
                for n in others:
                    await n.wait_for_line(_ready(2))
            formed = max(n.line_times[n.lines.index(next(filter(_ready(2), n.lines)))]
                         for n in others) - stopped_at  # fmt: skip
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        # generous: the workers' restart and the machine's load come on top (before:
        # nobody acted until read_timeout, 60 s)
        assert formed < 2 * HEARTBEAT + LAST_CALL + 3, formed
        # Resumed, the old host learns it was deposed: it stops its stale worker and
        # exits with an error naming the successor instead of carrying on alone.
        with anyio.fail_after(60):
            code = await host.wait()
        marker.touch()
        codes = await wait_all(others, 60)
    assert code != 0
    assert "declared it lost" in host.err, host.err
    assert codes == [0, 0], [n.err for n in others]
    assert sorted(_last_rank(n) for n in others) == ["rank=0", "rank=1"]
    assert any("new nodes use --rdzv-endpoint 127.0.0." in n.err for n in others)
    for pid in frozen:  # no stale worker left behind
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} of the deposed host still runs")
