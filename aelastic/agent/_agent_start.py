"""The start phase of :class:`~aelastic.agent.SimpleElasticAgent`: start a round's
workers after its rendezvous, and restart them (stop, publish the failure, back off,
close the round's resources, rendezvous again, start).

Both are torch's agent hooks (its tests override them). Cancellation stops nothing
here by itself: the round's resources, on ``self._round_stack``, stop the workers.
"""

from __future__ import annotations

import logging
from types import MappingProxyType

import anyio

from ..events import EventSource
from ._agent_core import AgentCore, agent_prof
from ._exceptions import AgentError
from ._types import WorkerGroup, WorkerState

__all__ = ("StartPhase",)

log = logging.getLogger("aelastic.agent")


class StartPhase(AgentCore):
    """Starting and restarting the workers."""

    @agent_prof
    async def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        """Rendezvous, then start a fresh set of workers; the group becomes HEALTHY."""
        role = worker_group.spec.role
        log.info("[%s] rendezvous'ing worker group", role)
        await self._rendezvous(worker_group)
        log.info("[%s] starting worker group", role)
        self._attempt += 1
        self._polled_exit_codes = {}
        worker_ids = await self._start_workers(worker_group)
        self.goodput.attempt_started()
        for local_rank, worker_id in worker_ids.items():
            worker_group.workers[local_rank].id = worker_id
        worker_group.state = WorkerState.HEALTHY
        for worker in worker_group.workers:
            self._record(self._construct_event("START", EventSource.WORKER, worker))

    @agent_prof
    async def _restart_workers(self, worker_group: WorkerGroup) -> None:
        """Restart the group (torch's agent contract): stop every local worker, rendezvous
        again and start fresh workers; the group ends ``HEALTHY``.

        In between, the round's resources (``self._round_stack``) are closed and a new
        stack is opened for the next round, and a restart after a failure (the group
        is ``FAILED``) publishes the failure (:attr:`last_failures`) and waits the
        restart policy's backoff. Cancellation: as :meth:`run`'s.

        Raises:
            AgentError: a worker survived SIGKILL (state D): not restarted on this host.
        """
        role = worker_group.spec.role
        failed = worker_group.state is WorkerState.FAILED
        log.info("[%s] stopping worker group", role)
        await self._stop_workers(worker_group)
        if failed:  # a failure restarted: publish it
            result = await self._monitor_workers(worker_group)
            if self._hang is not None:
                result = self._hang_result(worker_group, self._hang)
            self._explain_failures(result)
            self._last_failures = MappingProxyType(dict(result.failures))
        worker_group.state = WorkerState.STOPPED
        if failed:
            await anyio.sleep(self._restart_policy.backoff_seconds())
        stuck = self._unkillable_workers(worker_group)
        if stuck:
            worker_group.state = WorkerState.UNKNOWN
            raise AgentError(
                f"[{role}] worker(s) survived SIGKILL and cannot be reaped (local_rank: pid"
                f" {stuck}); they are probably in uninterruptible sleep (state D: a hung GPU,"
                " NCCL, RDMA or network file system call). Not restarting on this host:"
                " recycle it."
            )
        if self._round_stack is not None:  # inside run(): the next round's resources
            await self._round_stack.aclose()
            self._round_stack = self._open_round()
        await self._initialize_workers(worker_group)
