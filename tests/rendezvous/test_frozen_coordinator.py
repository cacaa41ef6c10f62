"""A round's coordinator frozen (SIGSTOP) before the round completes.

Nothing closes: the store cannot tell anyone, only the missing ticks do. The first
holder whose heartbeat timeout passes ends the round for all: it publishes the
``dissolved`` tick itself. Before, every holder waited out its own timeout, counted
from when it joined, so a node that arrived after the freeze waited longer.
"""

from __future__ import annotations

import logging
import os
import signal
from contextlib import AsyncExitStack

import anyio
import pytest

from aelastic.store import StoreServer

from .test_c10d import Joins, c10d, node

HEARTBEAT = 2.0
CONF = {
    "keep_alive_interval": "0.5",
    "heartbeat_timeout": str(HEARTBEAT),
    "last_call_timeout": "0.2",
    "is_host": "false",
}


async def test_frozen_coordinator_the_first_to_notice_ends_the_round_for_all(
    store_server: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aelastic.rendezvous")
    endpoint = f"127.0.0.1:{store_server.port}"
    local = store_server.local_store
    joins = Joins()
    async with AsyncExitStack() as stack:
        a, c, d = [await stack.enter_async_context(c10d(endpoint, 3, 3, **CONF)) for _ in "acd"]
        b = await stack.enter_async_context(node(endpoint, 3, 3, **CONF))
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(30):
                assert await b.line() == "entered"
                await local.wait(["rdzv/job/c/0/tick"])  # b coordinates round 0
                tg.start_soon(joins.join, a)
                await local.wait(["rdzv/job/c/0/node/1"])  # a holds ticket 1
            os.kill(b.process.pid, signal.SIGSTOP)
            try:
                # c and d are late: they arrive half a heartbeat timeout after the
                # freeze (the scenario, not a synchronisation), so their own timeouts
                # would expire that much after a's.
                await anyio.sleep(HEARTBEAT / 2)
                tg.start_soon(joins.join, c)
                tg.start_soon(joins.join, d)
                with anyio.fail_after(HEARTBEAT + 10):
                    await joins.wait(3)
            finally:
                os.kill(b.process.pid, signal.SIGCONT)
    assert sorted((i.rank, i.world_size, i.round) for i in joins.infos) == [
        (0, 3, 1),
        (1, 3, 1),
        (2, 3, 1),
    ]
    # Only a judged the coordinator (the old code: c and d too, each after its own
    # heartbeat timeout); c and d learnt from a's dissolved tick.
    judged = [r for r in caplog.records if "round 0: coordinator gone" in r.getMessage()]
    assert len(judged) == 1, [r.getMessage() for r in judged]
