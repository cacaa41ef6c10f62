"""The agent's state machine as coroutines: ``ElasticAgent`` and ``SimpleElasticAgent``.

One round is: rendezvous -> rank assignment -> start -> wait for whichever comes
first (a worker exit, a membership change, a cancellation) -> act on the decision
of :mod:`aelastic.agent._policy`. Nothing polls: a worker's exit and a membership
change wake the agent the moment they happen.

This module holds the public API, :meth:`~SimpleElasticAgent.run` and the loop that acts
on each round's decision. The phases live in their own modules, one class each,
combined here (a subclass overrides any of their methods, as torch's agent tests do):

* ``_agent_core``: the state every phase reads, and the subclass hooks;
* ``_agent_rendezvous``: joining a round, the workers' store endpoint, the ranks;
* ``_agent_start``: starting and restarting the workers;
* ``_agent_monitor``: waiting for a round's outcome, reviewing its decision;
* ``_agent_exit``: the exit barrier, closing or leaving the rendezvous, the release.
"""

from __future__ import annotations

import abc
import logging
import signal
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from types import MappingProxyType

import anyio
import anyio.lowlevel

from ..errors import ProcessFailure
from ..metrics import prof, put_metric
from ..progress._reader import ProgressSnapshot
from ..rendezvous import RendezvousGracefulExitError
from ._agent_exit import ExitBarrierPhase
from ._agent_monitor import MonitorPhase
from ._agent_rendezvous import RendezvousPhase
from ._agent_start import StartPhase
from ._exceptions import AgentError, SignalException
from ._policy import Action, decide_after_membership_change
from ._types import DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState

__all__ = ("ElasticAgent", "SimpleElasticAgent")

log = logging.getLogger("aelastic.agent")


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


class SimpleElasticAgent(StartPhase, MonitorPhase, RendezvousPhase, ExitBarrierPhase, ElasticAgent):
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
