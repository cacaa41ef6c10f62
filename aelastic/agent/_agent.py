"""The agent's state machine as coroutines: ``ElasticAgent`` and ``SimpleElasticAgent``.

One round is: rendezvous -> rank assignment -> start -> wait for whichever comes
first (a worker exit, a membership change, a cancellation) -> act on the decision
of :mod:`aelastic.agent._policy`. Nothing polls: a worker's exit and a membership
change wake the agent the moment they happen.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import signal
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ..errors import ProcessFailure
from ..events import EventSource
from ..metrics import prof, put_metric
from ..progress import ProgressSnapshot
from ..rendezvous import (
    RendezvousError,
    RendezvousGracefulExitError,
)
from ..store import StoreError, StoreTimeoutError
from ._agent_core import PEER_FINISHED_CHECK_TIMEOUT, PEER_FINISHED_KEY
from ._agent_exit import ExitBarrierPhase
from ._agent_rendezvous import RendezvousPhase
from ._exceptions import AgentError, SignalException
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
from ._types import DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState

if TYPE_CHECKING:  # imported with hang detection only (see aelastic._features)
    from ..progress import ProgressTimeouts
    from ._hang import Hang, RoundProgress
    from ._learned import LearnedTimeouts

__all__ = ("ElasticAgent", "SimpleElasticAgent")

log = logging.getLogger("aelastic.agent")

#: How long a job that failed for good waits for its other local workers to exit on
#: their own before stopping them (so simultaneous failures are all reported).
_FAILURE_GRACE = 1.0


class ElasticAgent(abc.ABC):
    """Manages one node's worker processes for an elastic job.

    ``result = await agent.run()``; ``result.is_failed()`` then ``result.failures``
    (by global rank), else ``result.return_values`` (by global rank).
    """

    @abc.abstractmethod
    async def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Run the workers, restarting them on failure up to ``max_restarts`` times."""

    @abc.abstractmethod
    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        """The (mutable, live) :class:`WorkerGroup` of ``role``."""


class SimpleElasticAgent(RendezvousPhase, ExitBarrierPhase, ElasticAgent):
    """An agent for one :class:`WorkerSpec`; subclasses say how workers start and stop.

    Subclass hooks (all called from the task running :meth:`run`):
    :meth:`_start_workers`, :meth:`_stop_workers`, :meth:`_monitor_workers`,
    :meth:`_shutdown` (torch's SimpleElasticAgent's four, enough for a working agent), and
    :meth:`_wait_for_worker_exit` with :meth:`_worker_exit_codes` (default: poll
    ``_monitor_workers`` every ``spec.monitor_interval`` s; override them to learn of
    an exit the moment it happens, as :class:`LocalElasticAgent` does).
    Resources a round needs (processes, the workers' store) go on
    ``self._round_stack``, closed when the round ends, even on cancellation.

    ``exit_barrier_timeout``, ``shutdown_timeout`` and ``uninterruptible_state_timeout``
    override the spec's values.

    Hang detection (opt-in, see :class:`WorkerSpec`'s heartbeat and section timeouts):
    subclasses set ``self._progress`` (a :class:`~aelastic.agent._hang.RoundProgress`)
    for the round; a worker past its deadline has every local worker's stacks written,
    then counts as a failure (restart within the budget, else FAILED saying "hung").

    D-state check (opt-in, off by default): with an ``uninterruptible_state_timeout``
    (argument, spec, or ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``) > 0, the agent
    reads its running workers' states (:meth:`_worker_states`) every
    ``min(timeout / 4, 5)`` s. A worker continuously in uninterruptible sleep for the
    timeout is logged with advice to recycle the host, the workers are stopped, and
    ``run()`` returns FAILED with a failure per stuck worker, without restarting
    (torch returns UNHEALTHY, which its launcher then treats as success; FAILED makes
    the CLI report it and exit 1). Off: nothing polls.

    Raises:
        AgentConfigError: the D-state timeout (or its variable) is not a number.
    """

    # -- public -----------------------------------------------------------------------

    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        return self._worker_group

    @property
    def remaining_restarts(self) -> int:
        """Restarts left in the failure budget."""
        return self._remaining_restarts

    @property
    def attempt(self) -> int:
        """Worker starts so far minus one (``attempt_<n>`` of the logs); -1 before the first."""
        return self._attempt

    @property
    def last_failures(self) -> Mapping[int, ProcessFailure]:
        """The workers that failed in the last round that failed, by global rank.

        Empty until a round fails. Published once that round's workers are stopped
        (so a hung worker is there, named by its hang, with the code it was stopped
        with): before the group leaves ``FAILED`` for ``STOPPED`` on a restart, and
        before :meth:`run` returns on the last failure. A new read-only mapping each
        time a round fails (compare by identity to see a new failure).
        """
        return self._last_failures

    def heartbeat_age_ms(self) -> int | None:
        """Milliseconds since the stalest last heartbeat of the running workers.

        None when no running worker has sent a heartbeat (``aelastic.progress``
        unused, or between rounds). Reads the workers' shared progress memory: a few
        microseconds, never blocks.
        """
        progress = self._progress
        if progress is None:
            return None
        exited = self._worker_exit_codes(self._worker_group).keys()
        beats = [
            snap.last_beat_ns
            for rank, snap in progress.snapshots().items()
            if snap.beats and rank not in exited
        ]
        if not beats:
            return None
        return (time.monotonic_ns() - min(beats)) // 1_000_000

    def progress_snapshots(self) -> dict[int, ProgressSnapshot]:
        """``{local_rank: snapshot}`` of what the running workers reported through
        ``aelastic.progress`` (empty when this round has no progress files). Reads
        shared memory: a few microseconds, never blocks."""
        progress = self._progress
        if progress is None:
            return {}
        exited = self._worker_exit_codes(self._worker_group).keys()
        return {rank: s for rank, s in progress.snapshots().items() if rank not in exited}

    @property
    def rendezvous_round(self) -> int | None:
        """The round of the last completed rendezvous (None before the first)."""
        return None if self._rdzv_info is None else self._rdzv_info.round

    def send_signal(self, sig: int, *, terminate: bool = True) -> None:
        """Handle a signal the embedding program received (the CLI forwards its signals here).

        With ``terminate=True`` (torchrun's behaviour for every handled signal) the agent
        stops its workers by sending them ``sig`` (then SIGKILL after the shutdown
        timeout), leaves the rendezvous, and :meth:`run` raises
        :class:`SignalException` with ``.sigval == sig``. With ``terminate=False`` the
        signal is only forwarded to the running workers' process groups (e.g. SIGUSR1
        as a preemption notice) and the run goes on.

        Call it from the event loop's thread (e.g. a task reading
        ``anyio.open_signal_receiver``); it never blocks. Calls before :meth:`run`
        make the next run stop at once; only the first terminating signal counts.
        """
        sigval = signal.Signals(sig)
        if not terminate:
            self._forward_signal(sigval)
            return
        if self._signal is None:
            self._signal = sigval
        if self._run_scope is not None:
            self._run_scope.cancel()

    @prof
    async def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Run the worker group until it succeeds or fails for good; return the result.

        Failures (a non-zero worker exit) restart the group up to ``max_restarts``
        times; membership changes restart it without spending that budget. On
        success the agent waits in the exit barrier for the other nodes.

        Every run ends with :meth:`_shutdown` (torch's agent contract; shielded, bounded
        by ``shutdown_timeout`` + 10 s, an error logged), with the terminating signal
        when there is one.

        Cancellation: cancelling the task awaiting ``run()`` stops the workers
        (SIGTERM, then SIGKILL after ``shutdown_timeout``), closes the round's
        resources, leaves the rendezvous (``shutdown()``, shielded and bounded) and
        re-raises the cancellation. No signal handler is installed.

        Raises:
            SignalException: :meth:`send_signal` asked the agent to terminate.
            RendezvousError: the rendezvous failed (closed, timed out, unreachable).
            AgentError: the agent cannot carry on (malformed store data...).
        """
        if self._running:
            raise AgentError("agent.run() is already running; an agent runs one group at a time")
        self._running = True
        start = time.monotonic()
        self.goodput.launched()
        result: RunResult | None = None
        try:
            with anyio.CancelScope() as scope:
                self._run_scope = scope
                if self._signal is not None:
                    scope.cancel()
                try:
                    # A handler nobody entered is entered for this run (issue 11).
                    async with self._worker_group.spec.rdzv_handler.entered():
                        result = await self._invoke_run(role)
                finally:
                    self._run_scope = None
            if self._signal is not None and result is None:
                started = self._attempt >= 0
                raise SignalException(
                    f"agent received {self._signal.name}; "
                    + ("its workers were stopped" if started else "no worker had started yet"),
                    self._signal,
                    workers_started=started,
                )
        except RendezvousGracefulExitError as exc:
            log.info("[%s] rendezvous asked this node to exit gracefully: %s", role, exc)
            result = RunResult(state=WorkerState.STOPPED)
        except BaseException as exc:
            self._total_execution_time = int(time.monotonic() - start)
            wg = self._worker_group
            if wg.state not in (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.UNKNOWN):
                # Stopped on request (cancellation, a signal): STOPPED; anything else
                # interrupted a transition: UNKNOWN.
                stopped = isinstance(exc, (SignalException, anyio.get_cancelled_exc_class()))
                wg.state = WorkerState.STOPPED if stopped else WorkerState.UNKNOWN
            await self._leave_rendezvous()
            # a run ended by a signal, an exclusion or an error has a ledger too
            self.goodput.finished()
            self._record_goodput()
            raise
        finally:
            self._running = False
            self.goodput.finished()
        assert result is not None
        await self._release(signal.SIGTERM)  # torch's agent: _shutdown() ends every run
        self._total_execution_time = int(time.monotonic() - start)
        self._record_metrics(result)
        self._record_goodput()
        self._record_worker_events(result)
        return result

    def _record_goodput(self) -> None:
        """The ``aelastic.goodput`` event: this node's ledger at the end of the run, flat
        (``wall_s``, ``productive_s``, ``ratio``, ``badput.<category>``, the step counts
        and the summary line)."""
        ledger = self.goodput.ledger()
        if ledger is None:
            return
        record = ledger.record()
        badput = record.pop("badput_s")
        assert isinstance(badput, dict)
        self._emit(
            "aelastic.goodput",
            {
                **record,
                **{f"badput.{c}": s for c, s in badput.items()},
                "summary": ledger.summary(),
            },
        )

    # -- the state machine -------------------------------------------------------------

    async def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        wg = self._worker_group
        spec = wg.spec
        role = spec.role
        log.info("[%s] starting workers for entrypoint: %s", role, spec.get_entrypoint_name())
        async with AsyncExitStack() as rounds:
            # the round's resources; _restart_workers closes them and opens the next's,
            # and leaving this block exits the open one as an ``async with`` would
            rounds.callback(setattr, self, "_round_stack", None)  # runs last
            self._open_round = lambda: rounds.push_async_exit(AsyncExitStack())
            self._round_stack = self._open_round()
            await self._initialize_workers(wg)
            while True:
                decision = await self._wait_for_outcome(wg)
                noticed_ns, first_action = time.monotonic_ns(), decision.action
                if decision.action is Action.FAIL and self._hang is None:
                    await self._collect_simultaneous_exits(wg)
                if decision.action in (Action.RESTART, Action.FAIL, Action.REJOIN):
                    # Stop the failed or hung group before the review's store requests
                    # (up to 40 s): its peers must not run on meanwhile. The progress
                    # snapshots the review reads stay mapped until the round ends.
                    await self._stop_workers(wg)
                if decision.action is Action.REJOIN:
                    # A worker that failed on its own while the change came in (its
                    # exit not delivered yet, or its error file written) makes this
                    # round a failure, not a free membership restart.
                    decision = decide_after_membership_change(
                        self._failed_before_stop_codes(wg).values(),
                        spec.local_world_size,
                        self._remaining_restarts,
                    )
                remaining_before = self._remaining_restarts
                decision = await self._review_decision(decision)
                reviewed = decision
                if self.node_gate is not None:  # repeated failures: this node steps out
                    decision = await self.node_gate.review(
                        decision,
                        remaining_before,
                        self._describe_outcome(wg),
                        spec.rdzv_handler,
                        self._emit,
                    )
                self._attempt_ended(first_action, decision, noticed_ns, decision is not reviewed)
                wg.state = decision.state
                put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)
                put_metric(f"workers.{role}.{wg.state.value}", 1)
                if decision.action is Action.SUCCEED:
                    result = await self._monitor_workers(wg)
                    log.info("[%s] worker group successfully finished", role)
                    with self.goodput.wait():
                        await self._exit_barrier()
                    return result
                if decision.action is Action.FAIL:
                    # Stop first: a peer that failed on its own while the first
                    # exit was handled is then in the result too.
                    await self._stop_workers(wg)
                    result = await self._monitor_workers(wg)
                    if self._hang is not None:
                        result = self._hang_result(wg, self._hang)
                    result.no_progress = self._restart_policy.stopped_for_no_progress
                    if self.node_gate is not None:  # the job's excluded nodes, if any
                        result.notes = await self.node_gate.notes(spec.rdzv_handler)
                    self._explain_failures(result)
                    self._last_failures = MappingProxyType(dict(result.failures))
                    wg.state = WorkerState.FAILED
                    log.error(
                        "[%s] worker group FAILED, no restarts left: %s",
                        role,
                        self._describe_outcome(wg),
                    )
                    await self._close_rendezvous()
                    return result
                if decision.action is Action.ABANDON:
                    return await self._abandon_host(wg)
                if decision.action is Action.RESTART:
                    log.warning(
                        "[%s] worker group FAILED (%s); %d/%d restarts left, restarting",
                        role,
                        self._describe_outcome(wg),
                        self._remaining_restarts,
                        spec.max_restarts,
                    )
                    self._remaining_restarts = decision.remaining_restarts
                else:
                    log.info(
                        "[%s] rendezvous membership changed (group_rank=%s); restarting"
                        " the worker group without spending a restart",
                        role,
                        wg.group_rank,
                    )
                await self._restart_workers(wg)

    @prof
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

    @prof
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

        An error from either side (e.g. the rendezvous failing while the workers run)
        cancels the other and is raised as is, not wrapped in an exception group.
        """
        spec = worker_group.spec
        lws = spec.local_world_size
        decided: list[Decision] = []
        errors: list[Exception] = []
        dstate_timeout = self._uninterruptible_state_timeout
        self._hang = None

        async with anyio.create_task_group() as tg:

            async def watch_progress(progress: RoundProgress) -> None:
                try:
                    hang = await progress.wait_for_hang(
                        lambda: self._worker_exit_codes(worker_group).keys()
                    )
                    from ._hang import report_hang  # loaded: a RoundProgress exists

                    # the root cause is decided again with the stacks: the event names it
                    self._hang = await report_hang(
                        hang,
                        progress,
                        lambda name, md: self._emit(
                            name, md, worker_group.workers[int(md["local_rank"])]
                        ),
                    )
                    decided.append(decide_after_hang(self._remaining_restarts))
                except Exception as exc:
                    errors.append(exc)
                tg.cancel_scope.cancel()

            async def watch_uninterruptible(limit: float) -> None:
                try:
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
                            decided.append(decide_after_stuck())
                            break
                except Exception as exc:
                    errors.append(exc)
                tg.cancel_scope.cancel()

            async def watch_exits() -> None:
                try:
                    while True:
                        await self._wait_for_worker_exit(worker_group)
                        codes = self._worker_exit_codes(worker_group).values()
                        decision = decide_after_exit(codes, lws, self._remaining_restarts)
                        if decision.action is not Action.WAIT:
                            decided.append(decision)
                            break
                except Exception as exc:
                    errors.append(exc)
                tg.cancel_scope.cancel()

            peer_finished = anyio.Event()
            handler = spec.rdzv_handler
            # A peer may host this round's store and take it along when it finishes:
            # learn its mark as it is set (elsewhere it is read when the membership
            # changes: a frozen store host must not delay that reading).
            watch_finished = handler.get_backend() == "c10d" and not handler.hosts_store

            async def watch_membership() -> None:
                try:
                    await spec.rdzv_handler.wait_for_membership_change()
                    codes = self._worker_exit_codes(worker_group).values()
                    finished = await self._peer_finished(
                        worker_group, peer_finished if watch_finished else None
                    )
                    decision = decide_after_membership_change(
                        codes, lws, self._remaining_restarts, finished
                    )
                    if decision.action is Action.WAIT:
                        log.info(
                            "[%s] a peer finished its workers and left; this node's workers "
                            "keep running (the job is ending, not changing membership)",
                            spec.role,
                        )
                        return  # nothing to rejoin: the workers' exits decide
                    decided.append(decision)
                except Exception as exc:
                    errors.append(exc)
                tg.cancel_scope.cancel()

            tg.start_soon(watch_exits)
            if watch_finished:
                tg.start_soon(self._watch_peer_finished, worker_group, peer_finished)
            tg.start_soon(watch_membership)
            if dstate_timeout is not None:
                tg.start_soon(watch_uninterruptible, dstate_timeout)
            if self._progress is not None and self._progress.timeouts.enabled:
                tg.start_soon(watch_progress, self._progress)
        if decided:
            return decided[0]
        raise errors[0]

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
