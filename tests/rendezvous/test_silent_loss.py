"""A member that goes silent without closing anything is removed heartbeat_timeout later.

The coordinator sweeps when the earliest member deadline passes (heartbeat_timeout +
min(keep_alive_interval, 1 s) after the last tick the member acknowledged), not only
at its periodic ticks: before, a silent member was judged between heartbeat_timeout +
1 and + 2 keep-alive intervals after it went silent (22 s with the defaults 15 s / 5 s).
"""

from __future__ import annotations

import anyio

from aelastic.store import LocalStore

from .test_dynamic import handlers, rendezvous_all

INTERVAL, HEARTBEAT = 2.0, 4.0


async def test_silent_member_is_removed_within_heartbeat_timeout_plus_a_second() -> None:
    store = LocalStore()
    kw = {"keep_alive_interval": INTERVAL, "heartbeat_timeout": HEARTBEAT}
    async with handlers(store, 3, 2, 3, last_call_timeout=0.1, **kw) as hs:
        with anyio.fail_after(10):
            await rendezvous_all(hs)
        frozen = next(h for h in hs if h._view is not None and h._view.ticket != 0)
        assert frozen._view is not None and frozen._view.scope is not None
        # Freeze it right after it acknowledged a periodic tick: the worst moment for a
        # rule that counts from the first tick it did not acknowledge.
        coordinator = next(h for h in hs if h._view is not None and h._view.ticket == 0)
        assert coordinator._view is not None
        with anyio.fail_after(10):
            seen = coordinator._view.tick
            while coordinator._view.tick is seen:
                await coordinator._view.event.wait()
        frozen._view.scope.cancel()  # its acknowledgements stop; nothing is closed
        silent_at = anyio.current_time()
        others = [h for h in hs if h is not frozen]
        with anyio.fail_after(HEARTBEAT + 10):
            for h in others:
                await h.wait_for_membership_change()
        noticed = anyio.current_time() - silent_at
        assert noticed < HEARTBEAT + 1.5, noticed  # the old rule: HEARTBEAT + 2 at least
        with anyio.fail_after(10):
            infos = await rendezvous_all(others)
        assert sorted(i.rank for i in infos) == [0, 1]
