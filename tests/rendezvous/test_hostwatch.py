"""Judging a store's host from a probe, and the watch that asks for it (issue 18)."""

from __future__ import annotations

import signal
import sys
from contextlib import AsyncExitStack

import anyio
import anyio.abc
import pytest
from _ports import free_port  # tests/ is on sys.path

from aelastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aelastic.rendezvous._c10d import _host_state
from aelastic.rendezvous._hostwatch import StoreWatch, host_lost
from aelastic.store import StoreServer

from .test_c10d import rendezvous_all


def _closed_port() -> int:
    return free_port()  # nothing listens there


def test_only_a_refusing_or_silent_host_is_lost() -> None:
    assert host_lost("refused") and host_lost("silent")
    assert not host_lost("answers") and not host_lost("unreachable")


async def test_probe_tells_a_live_store_a_stopped_one_and_a_frozen_one() -> None:
    async with StoreServer("127.0.0.1", 0) as server:
        assert await _host_state("127.0.0.1", server.port, 2.0) == "answers"
    assert await _host_state("127.0.0.1", _closed_port(), 2.0) == "refused"
    # Frozen: the kernel accepts, nobody answers.
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        with anyio.fail_after(5):
            assert await _host_state("127.0.0.1", port, 0.3) == "silent"


async def test_watch_cancels_a_waiting_request_once_the_probe_says_lost() -> None:
    probes: list[float] = []
    lost = RendezvousConnectionError("frozen")

    async def probe() -> RendezvousConnectionError | None:
        probes.append(anyio.current_time())
        return lost if len(probes) > 1 else None  # the first probe finds it alive

    watch = StoreWatch(0.2, probe)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        with (
            anyio.fail_after(5),
            pytest.raises(RendezvousConnectionError) as caught,
            watch.guard(),
        ):
            await anyio.sleep_forever()
        assert caught.value is lost and len(probes) == 2
        with pytest.raises(RendezvousConnectionError), watch.guard():  # later ones at once
            pass
        tg.cancel_scope.cancel()


async def test_frozen_standalone_store_the_coordinator_and_members_move_to_the_heir() -> None:
    """The store itself is frozen (SIGSTOP of ``python -m aelastic store``): the round's
    coordinator and its members all judge it lost, and the heir's store carries on."""
    port = _closed_port()
    conf = {
        "keep_alive_interval": "0.2",
        "heartbeat_timeout": "1",
        "last_call_timeout": "0.2",
        "read_timeout": "30",
        "join_timeout": "30",
        "is_host": "false",
    }
    argv = [sys.executable, "-m", "aelastic", "store", "--host", "127.0.0.1", "--port", str(port)]
    async with await anyio.open_process(argv) as store:
        try:
            async with AsyncExitStack() as stack:
                hs = []
                for i in range(3):  # own addresses: the heir binds the port at its own
                    params = RendezvousParameters(
                        "c10d", f"127.0.0.1:{port}", "frozen", 3, 3,
                        local_addr=f"127.0.0.{i + 2}", **conf,
                    )  # fmt: skip
                    hs.append(await stack.enter_async_context(get_rendezvous_handler(params)))
                with anyio.fail_after(30):
                    first = await rendezvous_all(hs)
                assert {i.round for i in first} == {0}
                store.send_signal(signal.SIGSTOP)
                with anyio.fail_after(20):
                    for h in hs:
                        await h.wait_for_membership_change()
                    again = await rendezvous_all(hs)
                assert sorted(i.rank for i in again) == [0, 1, 2]
                assert {h.epoch for h in hs} == {1}
                assert len({i.bootstrap_store_info.master_addr for i in again}) == 1
        finally:
            store.send_signal(signal.SIGCONT)
            store.kill()
