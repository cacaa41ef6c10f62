"""The job view outlives the c10d store's host: survivors publish into the heir's store."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream
from launcher._nodes import cluster, free_port
from launcher._notify import workers_listener
from launcher.test_multinode import FAST, _c10d

from ._live import STATUS, STEP_WORKER


async def _pids(lines: Any, count: int, old: set[str]) -> set[str]:
    """The pids of the next ``count`` workers (not in ``old``) that report steps."""
    pids: set[str] = set()
    while len(pids) < count:
        words = await lines.line()
        if words[0] == "stepped" and words[3] not in old:
            pids.add(words[3])
    return pids


async def _watch_until(flags: tuple[str, ...], pids: set[str]) -> dict[str, Any]:
    """``status --watch --json`` until the view's workers are exactly ``pids``."""
    argv = [*STATUS, *flags, "--json", "--watch", "--interval", "0.2"]
    watch = await anyio.open_process(argv, stderr=sys.stderr)  # its retries, for a failure
    async with watch:
        assert watch.stdout is not None
        lines = BufferedByteReceiveStream(watch.stdout)
        while True:
            view: dict[str, Any] = json.loads(await lines.receive_until(b"\n", 1 << 24))
            if {str(wk["pid"]) for n in view["nodes"] for wk in n["workers"]} == pids:
                watch.terminate()
                return view


async def test_survivors_of_the_store_host_show_in_the_heirs_store() -> None:
    port = free_port()
    conf = FAST.replace("heartbeat_timeout=1", "heartbeat_timeout=30")
    conf = conf.replace("last_call_timeout=0.5", "last_call_timeout=2")
    flags = ("--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "view-loss")
    async with workers_listener() as w, cluster() as c:
        tail = ["--heartbeat-timeout", "120", STEP_WORKER, str(w.port)]
        host = await c.start([*_c10d("2:3", port, "view-loss", conf + ",is_host=1"), *tail])
        for _ in range(2):
            await c.start([*_c10d("2:3", port, "view-loss", conf + ",is_host=0"), *tail])
        with anyio.fail_after(30):
            first = await _pids(w, 3, set())
            await _watch_until(flags, first)  # every node published into the host's store
        os.kill(host.process.pid, signal.SIGKILL)
        with anyio.fail_after(60):
            survivors = await _pids(w, 2, first)
            view = await _watch_until(flags, survivors)
        await w.tell_all("exit 0")
    nodes = view["nodes"]
    assert len(nodes) == 2 and {n["state"] for n in nodes} == {"HEALTHY"}
    assert sorted(wk["global_rank"] for n in nodes for wk in n["workers"]) == [0, 1]
    for node in nodes:
        kinds = [mark[1] for mark in node["history"]["marks"]]
        assert "store_moved" in kinds and "node_lost" in kinds, node["history"]
