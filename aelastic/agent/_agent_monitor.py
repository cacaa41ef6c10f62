"""The monitor phase of :class:`~aelastic.agent.SimpleElasticAgent`: wait for the round's
outcome and turn it into a decision and a result.

The watchers (worker exits, membership changes, a peer's finished mark, hangs, the
D-state check) race in one task group; the first decision cancels the others, and an
error from any of them is raised as is. The decisions themselves are the plain
functions of :mod:`aelastic.agent._policy`; this module only carries them out (stops
a stuck host's workers, reviews a decision against the restart policy, names a
round's failures).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ..errors import ProcessFailure
from ..rendezvous import RendezvousError
from ..store import StoreError, StoreTimeoutError
from ._agent_core import PEER_FINISHED_CHECK_TIMEOUT, PEER_FINISHED_KEY, AgentCore
from ._policy import (
    UNINTERRUPTIBLE_STATE_TIMEOUT_ENV,
    Action,
    Decision,
    decide_after_exit,
    decide_after_hang,
    decide_after_membership_change,
    decide_after_stuck,
    stuck_workers,
    track_uninterruptible,
    uninterruptible_poll_interval,
)
from ._types import RunResult, WorkerGroup, WorkerState

if TYPE_CHECKING:  # imported with hang detection only (see aelastic._features)
    from ..progress._timeouts import ProgressTimeouts
    from ._hang import Hang, RoundProgress
    from ._learned import LearnedTimeouts

__all__ = ("MonitorPhase",)

log = logging.getLogger("aelastic.agent")

#: How long a job that failed for good waits for its other local workers to exit on
#: their own before stopping them (so simultaneous failures are all reported).
_FAILURE_GRACE = 1.0


class MonitorPhase(AgentCore):
    """Waiting for a round's outcome, reviewing the decision, and the hang and D-state
    results."""

    async def _collect_simultaneous_exits(self, worker_group: WorkerGroup) -> None:
        """Before the stop that ends a failed job: give the local workers still running
        up to ``_FAILURE_GRACE`` s to exit on their own.

        Workers that fail together (a syntax error in every rank) are then all reported
        as failures, as torchrun's, rather than as workers this agent stopped. Returns
        once every worker has exited; a worker that keeps running (blocked in a
        collective) costs the whole grace, once, at the end of a failed job. Errors
        propagate as :meth:`_wait_for_worker_exit`'s.
        """
        lws = worker_group.spec.local_world_size
        with anyio.move_on_after(_FAILURE_GRACE):
            while len(self._worker_exit_codes(worker_group)) < lws:
                await self._wait_for_worker_exit(worker_group)

    async def _wait_for_outcome(self, worker_group: WorkerGroup) -> Decision:
        """Race the workers' exits against a membership change; return the first decision.

        The watchers (exits, membership, and, when on, hangs and the D-state check) run
        in one task group; the first decision cancels the others. An error from any of
        them (e.g. the rendezvous failing while the workers run) cancels the others and
        is raised as is, not wrapped in an exception group.
        """
        spec = worker_group.spec
        self._hang = None
        peer_finished = anyio.Event()
        handler = spec.rdzv_handler
        # A peer may host this round's store and take it along when it finishes:
        # learn its mark as it is set (elsewhere it is read when the membership
        # changes: a frozen store host must not delay that reading).
        watch_finished = handler.get_backend() == "c10d" and not handler.hosts_store
        async with anyio.create_task_group() as tg:
            race = _Race(tg.cancel_scope)
            tg.start_soon(race.run, partial(self._watch_exits, worker_group))
            if watch_finished:
                tg.start_soon(self._watch_peer_finished, worker_group, peer_finished)
            seen = peer_finished if watch_finished else None
            tg.start_soon(race.run, partial(self._watch_membership, worker_group, seen))
            if self._uninterruptible_state_timeout is not None:
                limit = self._uninterruptible_state_timeout
                tg.start_soon(race.run, partial(self._watch_uninterruptible, worker_group, limit))
            if self._progress is not None and self._progress.timeouts.enabled:
                tg.start_soon(race.run, partial(self._watch_progress, worker_group, self._progress))
        if race.decided:
            return race.decided[0]
        raise race.errors[0]

    async def _watch_exits(self, worker_group: WorkerGroup) -> Decision:
        """The decision of the first worker exit that is not a wait (a success while
        others still run is one)."""
        lws = worker_group.spec.local_world_size
        while True:
            await self._wait_for_worker_exit(worker_group)
            codes = self._worker_exit_codes(worker_group).values()
            decision = decide_after_exit(codes, lws, self._remaining_restarts)
            if decision.action is not Action.WAIT:
                return decision

    async def _watch_membership(
        self, worker_group: WorkerGroup, peer_finished: anyio.Event | None
    ) -> Decision | None:
        """The decision of the round's next membership change; None when a peer finished
        its workers and left (the job is ending: this node's workers' exits decide)."""
        spec = worker_group.spec
        await spec.rdzv_handler.wait_for_membership_change()
        codes = self._worker_exit_codes(worker_group).values()
        finished = await self._peer_finished(worker_group, peer_finished)
        decision = decide_after_membership_change(
            codes, spec.local_world_size, self._remaining_restarts, finished
        )
        if decision.action is Action.WAIT:
            log.info(
                "[%s] a peer finished its workers and left; this node's workers "
                "keep running (the job is ending, not changing membership)",
                spec.role,
            )
            return None  # nothing to rejoin: the workers' exits decide
        return decision

    async def _watch_uninterruptible(self, worker_group: WorkerGroup, limit: float) -> Decision:
        """The D-state check: poll the workers' states until one stayed in uninterruptible
        sleep for ``limit`` s; those workers go to ``self._stuck``."""
        interval = uninterruptible_poll_interval(limit)
        since: dict[int, float] = {}
        while True:
            await anyio.sleep(interval)
            now = time.monotonic()
            states = self._worker_states(worker_group)
            since = track_uninterruptible(since, states, now)
            stuck = stuck_workers(since, now, limit)
            if stuck:
                self._stuck = {r: worker_group.workers[r].id for r in stuck}
                return decide_after_stuck()

    async def _watch_progress(self, worker_group: WorkerGroup, progress: RoundProgress) -> Decision:
        """Hang detection: wait for a worker past its deadline, write every local worker's
        stacks (``self._hang``, its event names the root cause) and decide."""
        hang = await progress.wait_for_hang(lambda: self._worker_exit_codes(worker_group).keys())
        from ._hang import report_hang  # loaded: a RoundProgress exists

        # the root cause is decided again with the stacks: the event names it
        self._hang = await report_hang(
            hang,
            progress,
            lambda name, md: self._emit(name, md, worker_group.workers[int(md["local_rank"])]),
        )
        return decide_after_hang(self._remaining_restarts)

    async def _watch_peer_finished(self, worker_group: WorkerGroup, finished: anyio.Event) -> None:
        """Set ``finished`` once a node of this round marks its workers finished.

        Push-based (a store ``wait``), so the mark reaches this node before the finished
        node's departure does, even when that node hosted the store. Holds one store
        connection per node for the round, so it runs only where the store may leave
        with a peer (c10d, not hosted here). Never raises: a store that is lost or
        refuses only ends the watch.
        """
        store = worker_group.store
        if store is None:
            return
        try:
            while True:
                with contextlib.suppress(StoreTimeoutError):
                    await store.wait([PEER_FINISHED_KEY])
                    finished.set()
                    return
        except (StoreError, RendezvousError, OSError) as exc:
            log.debug("stopped watching for a finished peer: %s", exc)

    async def _peer_finished(self, worker_group: WorkerGroup, seen: anyio.Event | None) -> bool:
        """Whether a node of this round finished its workers: the mark ``seen`` by
        :meth:`_watch_peer_finished` when it runs, else a look in the store (bounded;
        False when the store cannot answer)."""
        if seen is not None:
            await anyio.lowlevel.checkpoint()  # let a mark delivered with the change land
            return seen.is_set()
        store = worker_group.store
        if store is None:
            return False
        with anyio.move_on_after(PEER_FINISHED_CHECK_TIMEOUT):
            try:
                return await store.check([PEER_FINISHED_KEY])
            except (StoreError, RendezvousError, OSError):
                pass
        return False

    def _attempt_ended(
        self, first: Action, decision: Decision, noticed_ns: int, excluded: bool
    ) -> None:
        """Tell the goodput ledger how this round ended: finished, or why it failed
        (``first``: the action the round's outcome asked for, before any review;
        ``excluded``: the node gate took this node out)."""
        fault_ns: int | None = None
        cause: str | None
        if decision.action is Action.SUCCEED:
            cause = None
        elif self._hang is not None:
            from ._hang import last_progress_ns  # loaded: a Hang exists

            cause, fault_ns = "hang", last_progress_ns(self._hang.snapshot)
        elif self._stuck:
            cause = "hang"
        elif excluded:
            cause = "exclusion"
        elif decision.action is Action.REJOIN and first is Action.REJOIN:
            cause = "membership"  # a node lost, once the next round is smaller
        else:
            cause = "crash"
        self.goodput.attempt_ended(self._rank_steps(), cause, fault_ns, noticed_ns)

    def _describe_outcome(self, wg: WorkerGroup) -> str:
        if self._hang is not None:
            return self._hang.describe()
        # once stopped, the workers that failed before the stop count too (a failure the
        # loop had not delivered when a membership change turned the round into one)
        return _describe_exits(
            {**self._worker_exit_codes(wg), **self._failed_before_stop_codes(wg)}
        )

    async def _review_decision(self, decision: Decision) -> Decision:
        """Apply the restart policy (job-wide budget, no-progress stop) to ``decision``."""
        progress = self._progress
        snapshots = list(progress.snapshots().values()) if progress is not None else []
        best = max((s.step for s in snapshots), default=-1)
        learning = self._worker_group.spec.learn_timeouts is not None
        if snapshots and learning and decision.action is not Action.ABANDON:
            await self._learned_timeouts().update(snapshots)
        round_ = self._rdzv_info.round if self._rdzv_info is not None else self._attempt
        return await self._restart_policy.review(decision, attempt_best_step=best, round_=round_)

    def _progress_timeouts(self) -> ProgressTimeouts:
        """The hang-detection timeouts of the next round (the spec's, or learned ones)."""
        spec = self._worker_group.spec
        if spec.learn_timeouts is None:
            return spec.progress_timeouts()
        return self._learned_timeouts().timeouts()

    def _learned_timeouts(self) -> LearnedTimeouts:
        if self._learned is None:
            # loaded with hang detection (aelastic._features) before the agent runs
            from ._learned import LearnedTimeouts

            self._learned = LearnedTimeouts(self._worker_group.spec, self._emit)
        return self._learned

    def _hang_result(self, wg: WorkerGroup, hang: Hang) -> RunResult:
        """FAILED, naming every hung worker, the root cause first (the others were stopped
        on purpose)."""
        from ._hang import hang_failures  # loaded: a Hang exists

        failures = hang_failures(hang, self._stopped_exit_codes(wg))
        return RunResult(
            state=WorkerState.FAILED,
            failures={wg.workers[rank].global_rank: f for rank, f in failures.items()},
        )

    async def _abandon_host(self, wg: WorkerGroup) -> RunResult:
        """Workers stuck in D-state: stop them, spend the budget, return FAILED naming them.

        The rendezvous is left by the caller (the CLI's handler context), not closed:
        the other nodes may carry on with a replacement host.
        """
        role = wg.spec.role
        stuck = dict(self._stuck)
        timeout = self._uninterruptible_state_timeout
        self._remaining_restarts = 0
        log.error(
            "[%s] worker(s) in uninterruptible sleep (state D in /proc/<pid>/stat) for over"
            " %s s (local_rank: pid %s): probably a hung GPU, NCCL, RDMA or network file"
            " system call. Stopping the workers and NOT restarting on this host: recycle it.",
            role,
            timeout,
            stuck,
        )
        await self._stop_workers(wg)
        codes = self._stopped_exit_codes(wg)
        unreaped = self._unkillable_workers(wg)
        failures: dict[int, ProcessFailure] = {}
        for rank, pid in stuck.items():
            worker = wg.workers[rank]
            failure = ProcessFailure(
                local_rank=rank,
                pid=pid,
                exitcode=codes.get(rank, -signal.SIGKILL),
                error_file=None,
            )
            failure.message = (
                f"worker (pid {pid}) stayed in uninterruptible sleep (state D) for over"
                f" {timeout} s ({UNINTERRUPTIBLE_STATE_TIMEOUT_ENV}); "
                + (
                    "it survived SIGKILL and was abandoned"
                    if rank in unreaped
                    else "the agent stopped it"
                )
                + ". A hung GPU, NCCL, RDMA or network file system call: recycle this host."
            )
            failures[worker.global_rank] = failure
        self._last_failures = MappingProxyType(dict(failures))
        wg.state = WorkerState.FAILED
        return RunResult(state=WorkerState.FAILED, failures=failures)


def _describe_exits(codes: Mapping[int, int]) -> str:
    failed = {rank: code for rank, code in codes.items() if code != 0}
    return ", ".join(f"local_rank {r} exited {c}" for r, c in sorted(failed.items())) or "no exit"


class _Race:
    """The watchers of one round, racing: the first decision or error ends the race
    (cancels ``scope``, the watchers' task group)."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        self.decided: list[Decision] = []
        self.errors: list[Exception] = []

    async def run(self, watch: Callable[[], Awaitable[Decision | None]]) -> None:
        """Run one watcher. Its decision ends the race, and so does its error (kept for
        the caller to raise); None (nothing to decide) leaves the others running."""
        try:
            decision = await watch()
            if decision is None:
                return
            self.decided.append(decision)
        except Exception as exc:
            self.errors.append(exc)
        self.scope.cancel()
