"""Rendezvous helpers shared by the agent tests and ``scripts/run_agent.py``."""

from __future__ import annotations

import anyio

from aelastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aelastic.store import LocalStore


class LocalRendezvous(RendezvousHandler):
    """A single-node rendezvous: every round is rank 0 of 1 over a fresh LocalStore.

    :meth:`change_membership` makes the pending ``wait_for_membership_change`` return.
    """

    def __init__(self, run_id: str = "test-run") -> None:
        self._run_id = run_id
        self.round = 0
        self._changed = anyio.Event()
        self.shutdown_calls = 0

    def get_backend(self) -> str:
        return "local-test"

    def get_run_id(self) -> str:
        return self._run_id

    async def next_rendezvous(self) -> RendezvousInfo:
        self.round += 1
        return RendezvousInfo(LocalStore(), 0, 1, None, self.round)

    async def is_closed(self) -> bool:
        return False

    async def set_closed(self) -> None:
        pass

    async def num_nodes_waiting(self) -> int:
        return 0

    async def wait_for_membership_change(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    def change_membership(self) -> None:
        self._changed.set()

    async def shutdown(self) -> bool:
        self.shutdown_calls += 1
        return True


def lapse_handler(endpoint: str) -> RendezvousHandler:
    """A c10d handler of run ``lapse`` (1..2 nodes) where a lost peer lapses in about 1 s.

    The in-test node and ``scripts/run_agent.py --c10d`` must agree on these settings.
    """
    params = RendezvousParameters(
        "c10d",
        endpoint,
        "lapse",
        1,
        2,
        is_host=False,
        last_call_timeout=0.2,
        keep_alive_interval=0.2,
        keep_alive_max_attempt=3,
        join_timeout=60,
    )
    return get_rendezvous_handler(params)
