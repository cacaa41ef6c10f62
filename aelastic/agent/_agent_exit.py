"""The exit phase of :class:`~aelastic.agent.SimpleElasticAgent`: the exit barrier after
a success, closing the rendezvous after a failure for good or a finished job, and
releasing the agent at the end of every run.

Every step is bounded and best effort: errors are logged, not raised, and the steps
that run while the agent is being cancelled are shielded.
"""

from __future__ import annotations

import logging
import signal
import time

import anyio

from ..rendezvous import RendezvousConnectionError, RendezvousError
from ..store import StoreError, StoreTimeoutError
from ._agent_core import PEER_FINISHED_CHECK_TIMEOUT, PEER_FINISHED_KEY, AgentCore

__all__ = ("ExitBarrierPhase",)

log = logging.getLogger("aelastic.agent")

_TERMINAL_STATE_SYNC_ID = "torchelastic/agent/terminal_state"
#: Bound on leaving the rendezvous during an abnormal exit (a dead backend must not hang us).
_RDZV_SHUTDOWN_TIMEOUT = 10.0
# How long the store's host waits after the exit barrier for its peers to acknowledge
# it (they do within a round trip; only a peer that died since it arrived costs this).
_EXIT_BARRIER_LINGER = 5.0


class ExitBarrierPhase(AgentCore):
    """The exit barrier, closing or leaving the rendezvous, and :meth:`_release`."""

    async def _mark_finished(self) -> None:
        """Tell this round's peers that this node's workers all succeeded (best effort,
        bounded): its departure after the exit barrier then does not restart theirs."""
        store = self._store
        if store is None:
            return
        with anyio.move_on_after(PEER_FINISHED_CHECK_TIMEOUT):
            try:
                await store.set(PEER_FINISHED_KEY, str(self._worker_group.group_rank))
            except (StoreError, RendezvousError, OSError) as exc:
                log.debug("could not mark this node finished: %s", exc)

    async def _exit_barrier(self) -> None:
        """Wait up to ``exit_barrier_timeout`` for every node to finish its workers.

        First marks this node finished in the round's store: a peer whose workers still
        run when this node leaves (the barrier timed out) keeps them running instead of
        taking the departure for a membership change.
        Keeps this agent (and the workers' store it may host) alive until the other
        nodes are done. Ends early when a peer will never arrive: the rendezvous was
        closed (a node failed for good), a participant left or lapsed (pytorch
        #99051: waiting out the whole timeout for a dead node helps nobody), or the
        rendezvous store is lost: a frozen store host is noticed by the rendezvous'
        watched requests (heartbeat timeout + at most 1 s probe, see
        ``rendezvous._hostwatch``), which never stop while this node is a member. This
        node's workers succeeded either way: it finishes. A node merely waiting to join
        does not end it. The node that hosts the store then waits (up to
        ``_EXIT_BARRIER_LINGER`` s) until every peer acknowledged the barrier's end:
        leaving closes the store, which would reset a peer whose wait the server had
        not answered yet. Errors other than cancellation are logged, not raised.
        """
        from ..store._utils import arrive_at_barrier, wait_for_departures

        wg = self._worker_group
        if self._store is None or wg.group_world_size is None:
            return
        log.info(
            "local worker group finished (%s); waiting up to %s s for other agents",
            wg.state.value,
            self._exit_barrier_timeout,
        )
        await self._mark_finished()
        started = time.monotonic()
        lost: list[str] = []
        arrival: int | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_for_lost_peers, tg.cancel_scope, lost)
                try:
                    arrival = await arrive_at_barrier(
                        self._store,
                        wg.group_world_size,
                        key_prefix=_TERMINAL_STATE_SYNC_ID,
                        timeout=self._exit_barrier_timeout,
                    )
                except StoreTimeoutError:  # a peer's workers still run: normal drift
                    lost.append("the other nodes' workers were still running")
                    self._peers_still_running = True
                except (StoreError, RendezvousError) as exc:  # e.g. its host already left
                    lost.append(f"the store is unreachable ({exc})")
                tg.cancel_scope.cancel()
            if arrival is not None and wg.spec.rdzv_handler.hosts_store:
                # Our exit closes the store: serve until every peer has read the
                # barrier's end (not cut short by a peer that leaves meanwhile: it
                # acknowledged first, and the others may still be reading).
                await wait_for_departures(
                    self._store,
                    wg.group_world_size,
                    _TERMINAL_STATE_SYNC_ID,
                    arrival,
                    within=min(_EXIT_BARRIER_LINGER, self._exit_barrier_timeout),
                )
        except Exception:
            log.exception(
                "error waiting on the exit barrier after %.1f s", time.monotonic() - started
            )
        else:
            elapsed = time.monotonic() - started
            if lost:
                log.warning("left the exit barrier after %.3f s: %s", elapsed, lost[0])
            else:
                log.info("done waiting for other agents after %.3f s", elapsed)
                if wg.group_rank == 0 and wg.spec.rdzv_handler.get_backend() == "c10d":
                    await self._close_finished_rendezvous()

    async def _close_finished_rendezvous(self) -> None:
        """Every member finished: close the rendezvous (as torch's ``shutdown`` does), so
        nodes that wait outside the job (spares, unhealthy or excluded nodes) learn that
        it ended instead of waiting for a round that never comes. Bounded, logged.

        c10d only: its store ends with the job's agents, while an etcd rendezvous outlives
        it and a later job may reuse the run id (a closed one would refuse it).
        """
        with anyio.move_on_after(_RDZV_SHUTDOWN_TIMEOUT, shield=True):
            try:
                await self._worker_group.spec.rdzv_handler.set_closed()
            except Exception as exc:
                log.warning("could not close the rendezvous of the finished job: %s", exc)

    async def _watch_for_lost_peers(
        self, barrier_scope: anyio.CancelScope, lost: list[str]
    ) -> None:
        """End the exit barrier (cancel ``barrier_scope``) once a peer cannot arrive."""
        handler = self._worker_group.spec.rdzv_handler
        try:
            await handler.wait_for_membership_change()
            if await handler.is_closed():
                lost.append("the rendezvous was closed (another node failed for good)")
            elif await handler.num_nodes_waiting() == 0:
                lost.append("a peer left or stopped heartbeating")
            else:
                return  # only a node waiting to join: keep waiting for the barrier
        except RendezvousConnectionError as exc:  # its store's host died, froze or hung
            lost.append(
                f"the rendezvous store is lost ({exc}); this node's workers succeeded: it "
                "finishes without waiting for the store's host"
            )
        except Exception as exc:  # the rendezvous itself is gone: so are the peers' chances
            lost.append(f"the rendezvous is unreachable ({exc})")
        barrier_scope.cancel()

    async def _close_rendezvous(self) -> None:
        """The job failed for good here: close the rendezvous so peers stop promptly.

        Without this, the other nodes notice this one leave, re-rendezvous and wait
        their whole ``join_timeout`` for a node that will not come back. Only a
        terminal failure closes it; leaving for any other reason (a signal, a
        cancellation) does not, so one stopped agent never ends a job that can go on.
        Best effort: bounded, shielded, and a failure to close is only logged.
        """
        with anyio.move_on_after(_RDZV_SHUTDOWN_TIMEOUT, shield=True):
            try:
                await self._worker_group.spec.rdzv_handler.set_closed()
            except Exception:
                log.exception("could not close the rendezvous after the job failed")

    async def _release(self, sig: signal.Signals) -> None:
        """:meth:`_shutdown` with ``sig``: shielded, bounded, an error logged."""
        with anyio.move_on_after(self._shutdown_timeout + _RDZV_SHUTDOWN_TIMEOUT, shield=True):
            try:
                await self._shutdown(sig)
            except Exception:
                log.exception("error while shutting the agent down")

    async def _leave_rendezvous(self) -> None:
        """Abnormal exit: release local resources and leave the rendezvous, shielded, bounded."""
        await self._release(self._signal or signal.SIGTERM)
        with anyio.move_on_after(_RDZV_SHUTDOWN_TIMEOUT, shield=True):
            try:
                await self._worker_group.spec.rdzv_handler.shutdown()
            except Exception:
                log.exception("error while leaving the rendezvous")
