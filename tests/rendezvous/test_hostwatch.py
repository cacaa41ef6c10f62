"""Judging a store's host from a probe, and the watch that asks for it (issue 18)."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest

from aelastic.rendezvous import RendezvousConnectionError
from aelastic.rendezvous._c10d import _host_state
from aelastic.rendezvous._hostwatch import StoreWatch, host_lost
from aelastic.store import StoreServer


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


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
