"""A c10d rendezvous closed by the node that hosts its store (the job failed for good
there): the store goes with that node, so the close must reach the members first."""

from __future__ import annotations

import signal

import anyio
from _ports import free_port  # tests/ is on sys.path
from anyio.streams.text import TextReceiveStream

from aelastic.rendezvous import RendezvousHandler
from aelastic.rendezvous._c10d import C10dRendezvousHandler

from .test_c10d import c10d, node

#: join_timeout stays long: a member that missed the close would wait it out.
CONF = {"join_timeout": "60", "heartbeat_timeout": "2", "close_timeout": "30"}


def _endpoint() -> str:
    return f"127.0.0.1:{free_port()}"


async def _members_done(host: RendezvousHandler) -> list[int]:
    """The tickets of the host's round, other than its own, that set their ``done`` key."""
    assert isinstance(host, C10dRendezvousHandler)
    view = host._member_view
    assert host.server is not None and view is not None
    keys = await host.server.local_store.list_keys()
    return [t for t in (0, 1) if t != view.ticket and host._keys.done(view.round, t) in keys]


async def test_the_closing_store_host_waits_until_the_member_saw_it_closed() -> None:
    endpoint = _endpoint()
    async with node(endpoint, 2, 2, is_host="0", **CONF) as member:
        async with c10d(endpoint, 2, 2, is_host="1", **CONF) as host:
            with anyio.fail_after(30):
                assert await member.line() == "entered"
                await host.next_rendezvous()
                assert (await member.line()).startswith("admitted")
                await host.set_closed()
            # Returned only once the member read the closed tick (it set its key then).
            assert len(await _members_done(host)) == 1
        # The host left and its store with it; the member knows the rendezvous is
        # closed without asking the store: it stops at once (not after join_timeout).
        with anyio.fail_after(10):
            assert await member.line() == "changed"
            assert await member.process.wait() != 0
        assert member.process.stderr is not None
        err = "".join([chunk async for chunk in TextReceiveStream(member.process.stderr)])
        assert "RendezvousClosedError" in err, err
        assert "hosts its successor" not in err, err


async def test_a_frozen_member_holds_the_closing_host_up_for_heartbeat_timeout_at_most() -> None:
    endpoint = _endpoint()
    async with (
        node(endpoint, 2, 2, is_host="0", **CONF) as member,
        c10d(endpoint, 2, 2, is_host="1", **CONF) as host,
    ):
        with anyio.fail_after(30):
            assert await member.line() == "entered"
            await host.next_rendezvous()
            assert (await member.line()).startswith("admitted")
        member.process.send_signal(signal.SIGSTOP)
        # close_timeout is 30 s: the wait for the member is bounded by heartbeat_timeout.
        with anyio.fail_after(float(CONF["heartbeat_timeout"]) + 3):
            await host.set_closed()
        assert await _members_done(host) == []
