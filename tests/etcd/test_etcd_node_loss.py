"""The etcd rendezvous survives the loss of any node: there is no store host to lose.

``test_etcd_rendezvous`` kills the node that joined first; here the node that joined
last, the one that completed the round (wrote its ``done`` key), is SIGKILLed.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from test_etcd_rendezvous import make, rendezvous_all

from aelastic.rendezvous import RendezvousInfo
from aelastic.rendezvous.etcd._client import prefix_end

NODE = Path(__file__).with_name("_node.py")


async def test_sigkilled_completing_node_the_others_go_on(etcd_endpoint: str, run_id: str) -> None:
    # lease TTL 2 s; a long last call: round 0 completes only when the third node joins
    conf = {"keep_alive_interval": 0.5, "keep_alive_max_attempt": 2, "last_call_timeout": 30}
    async with AsyncExitStack() as stack:
        hs = [
            await stack.enter_async_context(make(etcd_endpoint, run_id, 2, 3, **conf))
            for _ in range(2)
        ]
        infos: list[RendezvousInfo] = []
        async with anyio.create_task_group() as tg:

            async def join(i: int) -> None:
                infos.append(await hs[i].next_rendezvous())

            prefix = hs[0]._keys.joins(0)
            async with hs[0].client.watch(prefix, prefix_end(prefix), start_revision=1) as w:
                tg.start_soon(join, 0)
                tg.start_soon(join, 1)
                with anyio.fail_after(20):
                    seen = 0
                    while seen < 2:  # both in-process nodes joined round 0
                        seen += len(await w.next())
            proc = await anyio.open_process(
                [sys.executable, str(NODE), etcd_endpoint, run_id, "2", "3"],
                stderr=subprocess.DEVNULL,
            )
            stack.push_async_callback(proc.aclose)
            stack.callback(lambda: proc.returncode is None and proc.kill())
        assert proc.stdout is not None
        with anyio.fail_after(20):
            line = (await proc.stdout.receive()).decode()
        assert {i.world_size for i in infos} == {3} and "world 3" in line
        proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):  # lease TTL 2 s plus etcd's expiry sweep
            await hs[0].wait_for_membership_change()
        for h in hs:
            h.settings = dataclasses.replace(h.settings, last_call_timeout=0.3)
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == [0, 1] and {i.world_size for i in infos} == {2}
