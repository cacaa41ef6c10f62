"""The rendezvous phase of :class:`~aelastic.agent.SimpleElasticAgent`: join the next
round, agree on the workers' store endpoint, assign the workers' ranks.

A member that dies during the rank assignment sends this node to the next round
instead of leaving it waiting (the assignment races the round's membership).
Cancellation cancels the join and the assignment; rendezvous and store errors
propagate to :meth:`~aelastic.agent.SimpleElasticAgent.run`.
"""

from __future__ import annotations

import logging
import time

import anyio

from .._net import free_port
from ..events import EventSource
from ..rendezvous import RendezvousInfo
from ..store import Store
from ._agent_core import AgentCore, agent_prof
from ._policy import restart_count
from ._rank_exchange import exchange_ranks
from ._telemetry import hostname
from ._types import Worker, WorkerGroup, WorkerSpec

__all__ = ("RendezvousPhase",)

log = logging.getLogger("aelastic.agent")


class RendezvousPhase(AgentCore):
    """Rendezvous and rank assignment; subclasses may override each step (torch's agent
    tests override :meth:`_rendezvous`; :class:`LocalElasticAgent` hosts the workers'
    store in :meth:`_worker_store_endpoint`)."""

    @agent_prof
    async def _rendezvous(self, worker_group: WorkerGroup) -> None:
        """Join the next round, assign ranks, and agree on the workers' store endpoint.

        A member that dies between the round's completion and the rank assignment
        would leave the others waiting on its role info or its assignment forever, so
        the assignment races the round's membership: when the membership changes
        first, this node joins the next round instead.
        """
        spec = worker_group.spec
        while True:
            if self.node_gate is not None:  # an unhealthy node stays out of the round
                await self.node_gate.admit(spec.rdzv_handler, self._emit)
            started = time.monotonic()
            with self.goodput.wait():
                info = await spec.rdzv_handler.next_rendezvous()
            if info.world_size < (worker_group.group_world_size or 0):
                self.goodput.reclassify("node_loss")
            self._rdzv_info = info
            self._store = info.store
            worker_group.store = info.store
            worker_group.group_rank = info.rank
            worker_group.group_world_size = info.world_size
            self._record(
                self._construct_event(
                    "RENDEZVOUS", EventSource.AGENT, duration_ms=_ms_since(started)
                )
            )
            started = time.monotonic()
            # Group rank 0 hosts the workers' store here, in this task: a StoreServer
            # on the round's stack must be entered by the task that leaves it.
            self._store_endpoint = await self._worker_store_endpoint() if info.rank == 0 else None
            workers = await self._assign_ranks_unless_members_change(info, spec)
            if workers is not None:
                break
            log.warning(
                "[%s] the round's membership changed during rank assignment (a member left "
                "or died); joining the next round",
                spec.role,
            )
        worker_group.workers = workers
        self._record(
            self._construct_event(
                "ASSIGN_WORKER_RANKS", EventSource.AGENT, duration_ms=_ms_since(started)
            )
        )
        log.info(
            "[%s] rendezvous complete: restart_count=%d master=%s:%s group_rank=%d"
            " group_world_size=%d global_ranks=%s role_ranks=%s world_size=%d",
            spec.role,
            restart_count(spec.max_restarts, self._remaining_restarts),
            worker_group.master_addr,
            worker_group.master_port,
            info.rank,
            info.world_size,
            [w.global_rank for w in workers],
            [w.role_rank for w in workers],
            workers[0].world_size,
        )

    async def _worker_store_endpoint(self) -> tuple[str, int, bool]:
        """Group rank 0: decide (and host, if needed) the workers' store; ``(addr, port, agent)``.

        ``agent`` is ``TORCHELASTIC_USE_AGENT_STORE``. Subclasses may host the store on
        ``self._round_stack``. This default (torch's SimpleElasticAgent's) hosts none: without a
        ``master_port`` it takes ``master_addr``, else ``local_addr``, else this host's
        name, and a port free now (worker rank 0 then hosts torch's store there); with
        one, ``agent`` is True when the rendezvous serves that port itself
        (``use_agent_store`` and its bootstrap endpoint), else False.
        """
        spec = self._worker_group.spec
        if spec.master_port is None:
            return spec.master_addr or spec.local_addr or hostname(), free_port(), False
        boot = None if self._rdzv_info is None else self._rdzv_info.bootstrap_store_info
        # The rendezvous itself serves that endpoint (torch's static backend): workers
        # must connect to it as clients rather than bind it.
        agent_store = (
            spec.rdzv_handler.use_agent_store
            and boot is not None
            and boot.master_port == spec.master_port
        )
        addr = spec.master_addr or spec.local_addr or (boot.master_addr if boot else None)
        return addr or hostname(), spec.master_port, agent_store

    @agent_prof
    async def _assign_ranks_unless_members_change(
        self, info: RendezvousInfo, spec: WorkerSpec
    ) -> list[Worker] | None:
        """:meth:`_assign_worker_ranks`, or None if the round's membership changes first.

        Cancelling the caller cancels both the assignment and the watch; an error from
        either (the store, the rendezvous) propagates.
        """
        assigned: list[list[Worker]] = []
        async with anyio.create_task_group() as tg:

            async def assign() -> None:
                assigned.append(
                    await self._assign_worker_ranks(info.store, info.rank, info.world_size, spec)
                )
                tg.cancel_scope.cancel()

            async def watch() -> None:
                await spec.rdzv_handler.wait_for_membership_change()
                tg.cancel_scope.cancel()

            tg.start_soon(assign)
            tg.start_soon(watch)
        return assigned[0] if assigned else None

    async def _assign_worker_ranks(
        self, store: Store, group_rank: int, group_world_size: int, spec: WorkerSpec
    ) -> list[Worker]:
        """This node's workers with their global and role ranks (:func:`exchange_ranks`, O(1)
        requests per agent); also sets ``master_addr``/``master_port`` on the group."""

        async def endpoint() -> tuple[str, int, bool]:
            return self._store_endpoint or await self._worker_store_endpoint()

        mine, addr, port, agent_store = await exchange_ranks(
            store, group_rank, group_world_size, spec, endpoint
        )
        wg = self._worker_group
        wg.master_addr, wg.master_port = addr, port
        self._use_agent_store = agent_store
        return [
            Worker(
                local_rank=i,
                global_rank=mine.base_global_rank + i,
                role_rank=mine.base_role_rank + i,
                world_size=mine.world_size,
                role_world_size=mine.role_world_size,
            )
            for i in range(spec.local_world_size)
        ]


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000.0, 3)
