"""``open_job``: a handle on one node's job running in the caller's event loop.

``async with aelastic.open_job(config, entrypoint, *args) as job:`` starts the node
(rendezvous, workers, restarts) in a task of its own and hands back a :class:`Job`:
its live state, the state transitions as they happen (pushed by the agent, never
polled), this job's events, its workers, signal forwarding and ``await job.wait()``.
Leaving the block stops the job. ``job = await task_group.start(run_job, config,
entrypoint, *args)`` is the same, returned once the workers are up. Never imports torch.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._dataclass import dataclass
from .._net import node_name
from .._tasks import background_tasks
from ._build import PreparedJob, prepare_job
from ._config import LaunchConfig
from ._exceptions import JobSignalError, JobStoppedError
from ._preimport import import_off_loop, job_modules

if TYPE_CHECKING:
    from ..agent import RunResult, WorkerGroup, WorkerState
    from ..errors import ProcessFailure
    from ..events._subscribe import EventStream
    from ..health._http import Response
    from ..jobview._publish import StatusPublisher
    from ..progress._reader import ProgressSnapshot
    from ..stragglers import SlowInterval
    from ..stragglers._watch import StragglerWatch

__all__ = (
    "FailureInfo",
    "HangInfo",
    "Job",
    "StateChange",
    "WorkerInfo",
    "open_job",
    "run_job",
)

#: State transitions a :class:`Job` keeps for late readers of :meth:`Job.state_changes`.
_HISTORY = 1_000
#: Events a :class:`Job` keeps for late subscribers of :meth:`Job.events`.
_EVENT_BACKLOG = 1_000
#: The buffer of the job's own subscription, drained by its event task.
_EVENT_BUFFER = 10_000


#: Node-gate events marked on the job view's time axis (``aelastic.jobview``), by kind.
_VIEW_MARKS = {"aelastic.node.excluded": "excluded", "aelastic.node.unhealthy": "unhealthy"}


@dataclass(frozen=True)
class StateChange:
    """One transition of the job's worker group (see :class:`aelastic.agent.WorkerState`).

    ``previous`` is None for the first item (the group's initial ``INIT``). ``round``
    is the rendezvous round the workers belong to (None before the first one),
    ``attempt`` the worker start (``attempt_<n>`` of the logs, -1 before the first),
    ``restart_count`` the failures restarted so far (the workers'
    ``TORCHELASTIC_RESTART_COUNT``), ``timestamp`` the wall clock (``time.time()``).
    """

    state: WorkerState
    previous: WorkerState | None
    round: int | None
    attempt: int
    restart_count: int
    remaining_restarts: int
    timestamp: float


@dataclass(frozen=True)
class WorkerInfo:
    """One local worker of the current (or last) attempt.

    ``pid`` is None before the worker started; ``stdout``/``stderr``/``error_file`` are
    the files of this attempt (None when not redirected to a file).
    """

    local_rank: int
    global_rank: int
    role_rank: int
    world_size: int
    pid: int | None
    attempt: int
    stdout: str | None
    stderr: str | None
    error_file: str | None


@dataclass(frozen=True)
class FailureInfo:
    """A worker of the last attempt that failed (restarted or not): the lowest local rank
    among the failures the agent reported once it stopped that attempt's workers (a
    hung worker: with the code it was stopped with). ``wait()``'s ``ChildFailedError``
    names the root cause."""

    local_rank: int
    global_rank: int
    pid: int | None
    exitcode: int
    attempt: int
    timestamp: float


@dataclass(frozen=True)
class HangInfo:
    """The last hung worker the agent found (its ``aelastic.progress.hang`` event).

    ``rule`` is the deadline that expired (``initial``, ``heartbeat``, ``section``,
    ``out_of_section``), ``section`` the section it was in (None: none), ``timeout``
    that rule's seconds, ``stacks_file`` where every local worker's stacks were
    written (``stacks_captured`` of them), ``detected_at`` the wall clock.
    """

    global_rank: int | None
    local_rank: int
    pid: int
    rule: str
    section: str | None
    timeout: float
    stacks_file: str | None
    stacks_captured: int
    step: int
    detected_at: float


class Job:
    """A handle on one node's job; made by :func:`open_job` (do not construct it).

    Every method is called from the event loop running the job; none blocks.
    """

    def __init__(self, config: LaunchConfig, prepared: PreparedJob) -> None:
        self.config = config
        #: the run id shared by every node (``config.run_id`` or a fresh one)
        self.run_id = prepared.run_id
        #: the entrypoint's name, as in errors and logs
        self.name = prepared.name
        #: ``(host, port)`` of the health endpoint, when ``config.health_port`` is set
        self.health_address: tuple[str, int] | None = None
        #: this node's host name, as reported by ``/status``
        self.node = node_name()
        self._prepared = prepared
        self._agent = prepared.agent
        self._history: collections.deque[StateChange] = collections.deque(maxlen=_HISTORY)
        self._changes = 0  # transitions ever recorded (the index after the last one)
        self._changed = anyio.Event()
        self._done = anyio.Event()
        self._outcome: RunResult | BaseException | None = None
        #: cancelled by :meth:`stop` (made now: a stop before the job's task runs counts)
        self._run_scope = anyio.CancelScope()
        self._stop_requested = False
        #: True while the node enters its rendezvous (connects to the store, which may
        #: take up to read_timeout): the agent's run has not begun to take a signal.
        self._entering = False
        self._entry_signal: signal.Signals | None = None
        self._events_source: EventStream | None = None  # the job's registry subscription
        self._event_backlog: collections.deque[Any] = collections.deque(maxlen=_EVENT_BACKLOG)
        self._event_streams: list[EventStream] = []  # subscribers fed from the backlog on
        self._events_ended = False
        self._last_failure: FailureInfo | None = None
        #: the agent's ``last_failures`` mapping ``_last_failure`` was made from
        self._failures_seen: Mapping[int, ProcessFailure] = self._agent.last_failures
        self._last_hang: HangInfo | None = None
        #: hangs found and stacks written so far (from the job's own events)
        self.hang_count = 0
        self.stacks_captured = 0
        #: the heartbeat timeout ``learn_timeouts`` learned, in seconds (None: none yet)
        self.learned_heartbeat_timeout: float | None = None
        #: publishes this node's status into the rendezvous store (``aelastic.jobview``)
        self.status_publisher: StatusPublisher | None = None
        #: set before the run ends: read the job's view at the end (``aelastic run``'s
        #: goodput line, the job's); the view read, None if it could not be
        self._want_end_view = False
        self._end_view: dict[str, Any] | None = None
        #: finds this node's slow ranks (``aelastic.stragglers``; None: detection off)
        self.straggler_watch: StragglerWatch | None = None
        group = self._agent.get_worker_group()
        self._push(group.state, None)
        group.add_state_listener(self._on_state)

    # -- live view ---------------------------------------------------------------------

    @property
    def state(self) -> WorkerState:
        """The worker group's state now (``INIT``, ``HEALTHY``, ``STOPPED``...)."""
        return self._agent.get_worker_group().state

    @property
    def role(self) -> str:
        """The workers' role (``config.role``)."""
        return self._agent.get_worker_group().spec.role

    @property
    def round(self) -> int | None:
        """The rendezvous round of the current workers (None before the first)."""
        return self._agent.rendezvous_round

    @property
    def remaining_restarts(self) -> int:
        """Failures that may still be restarted."""
        return self._agent.remaining_restarts

    @property
    def restart_count(self) -> int:
        """Failures restarted so far."""
        from ..agent import restart_count

        return restart_count(self.config.max_restarts, self._agent.remaining_restarts)

    @property
    def last_failure(self) -> FailureInfo | None:
        """A failed worker of the last attempt that failed (None: none failed yet).

        Known once that attempt's workers are stopped (the agent's ``last_failures``):
        a hung worker is named with the code it was stopped with.
        """
        self._take_failures()
        return self._last_failure

    @property
    def last_hang(self) -> HangInfo | None:
        """The last hung worker the agent found (None: none hung so far)."""
        return self._last_hang

    def heartbeat_age_ms(self) -> int | None:
        """Milliseconds since the stalest last heartbeat of the running workers (None:
        no running worker uses ``aelastic.progress`` heartbeats)."""
        return self._agent.heartbeat_age_ms()

    def idle_interpreters(self) -> tuple[int, int]:
        """Idle warm worker interpreters: how many, and their resident memory in bytes."""
        return self._agent.idle_interpreters()

    @property
    def log_dir(self) -> str | None:
        """This node's log directory of the job, ``<log_dir>/<run_id>_<random>``: the
        ``attempt_<n>`` directories of the workers' output and error files.

        None before the first workers start, and with ``log_dir=os.devnull``. With
        ``config.log_dir`` None it is a fresh temporary directory, removed when the job
        ends as far as it holds no file (nothing is left of a job that wrote nothing).
        """
        return self._agent.log_run_dir

    @property
    def history(self) -> tuple[StateChange, ...]:
        """The state transitions so far, oldest first (the last 1000): a snapshot.

        Readable at any time, also after the ``open_job`` block: once :attr:`done`,
        the last item is the job's final state (``SUCCEEDED``, ``FAILED``, ``STOPPED``
        when it was stopped or let go by the rendezvous, ``UNKNOWN`` when an error
        ended it), which a watcher inside the block may not live to see.
        """
        return tuple(self._history)

    def checkpoint_status(self) -> dict[str, Any] | None:
        """This node's :mod:`aelastic.checkpoint` state: memory directory, bytes held,
        the step the workers resumed from, the last step written to ``checkpoint_dir``
        (None outside the run). A listing and a few ``stat`` calls in ``/dev/shm``."""
        checkpoints = self._agent.checkpoints
        return None if checkpoints is None else checkpoints.status()

    @property
    def group_rank(self) -> int | None:
        """This node's rank among the nodes of the current round (None before the first)."""
        return self._agent.get_worker_group().group_rank

    def progress(self) -> dict[int, ProgressSnapshot]:
        """``{local_rank: ProgressSnapshot}`` of the running workers' ``aelastic.progress``
        reports (every round has progress files; empty between rounds)."""
        return self._agent.progress_snapshots()

    def goodput(self) -> dict[str, Any] | None:
        """Where this node's time went since the launch (:mod:`aelastic.goodput`):
        ``{"wall_s", "productive_s", "ratio", "badput_s": {category: s}, "steps_kept",
        "steps_lost"}`` (steps None when the workers report none); None before the run
        starts. The whole job's (every node's, combined) is ``aelastic status --json``'s."""
        ledger = self._agent.goodput.ledger()
        return None if ledger is None else ledger.record()

    def goodput_summary(self) -> str | None:
        """This node's ledger as one line: ``goodput 96.1% of 312.0 s: restart 2.1 s (2), ...``."""
        ledger = self._agent.goodput.ledger()
        return None if ledger is None else ledger.summary()

    def node_health(self) -> dict[str, Any] | None:
        """The last health check pass before a round (``/status``'s ``node_health``):
        ``{"healthy", "checked_at", "strikes", "checks": [...]}``; None: no checks."""
        gate = self._prepared.node_gate
        report = None if gate is None else gate.report
        return None if report is None else report.as_dict()

    def unhealthy_reason(self) -> str | None:
        """Why this node is kept out of the job (a failed health check), else None."""
        gate = self._prepared.node_gate
        if gate is None or gate.report is None or gate.report.healthy:
            return None
        return gate.report.reason()

    def straggler_status(self) -> dict[str, Any] | None:
        """This node's straggler scores and verdict (``/status``'s ``stragglers``):
        ``{"action", "threshold", "scores": {rank: {"relative", "individual"}}, "slow":
        None or {"ranks": {rank: score}, "whole_node", "since"}, "slow_seconds"}``;
        None when detection is off."""
        watch = self.straggler_watch
        return None if watch is None else watch.status()

    def slow_intervals(self) -> list[SlowInterval]:
        """This node's stretches of being slow (a straggler), oldest first, wall clock:
        what a goodput ledger counts as time spent slow. [] when detection is off."""
        watch = self.straggler_watch
        return [] if watch is None else list(watch.intervals)

    @property
    def done(self) -> bool:
        """Whether the job has finished (:meth:`wait` returns or raises at once)."""
        return self._done.is_set()

    def workers(self) -> list[WorkerInfo]:
        """The local workers of the current (or last) attempt, by local rank."""
        group = self._agent.get_worker_group()
        attempt = self._agent.attempt
        dests = self._agent.log_destinations
        out = []
        for w in group.workers:
            rank = w.local_rank
            out.append(
                WorkerInfo(
                    local_rank=rank,
                    global_rank=w.global_rank,
                    role_rank=w.role_rank,
                    world_size=w.world_size,
                    pid=w.id,
                    attempt=attempt,
                    stdout=None if dests is None else dests.stdouts.get(rank),
                    stderr=None if dests is None else dests.stderrs.get(rank),
                    error_file=None if dests is None else dests.error_files.get(rank),
                )
            )
        return out

    async def state_changes(self) -> AsyncGenerator[StateChange, None]:
        """Every state transition from ``INIT`` on, as the agent makes it; ends with the job.

        ``async for change in job.state_changes():``. Each call starts from the
        earliest transition kept (the last 1000), then waits for new ones: the agent
        pushes them, nothing polls. A reader never slows the job down; one that falls
        more than 1000 transitions behind skips the oldest. Cancelling the wait loses
        nothing for a new iterator.
        """
        index = self._changes - len(self._history)
        while True:
            while index < self._changes:
                first = self._changes - len(self._history)
                index = max(index, first)
                change = self._history[index - first]
                index += 1
                yield change
            if self._done.is_set():
                return
            await self._changed.wait()

    def events(self, *, max_buffer: int = 10_000) -> EventStream:
        """Stream this job's events (those whose run id is :attr:`run_id`), earlier ones first.

        ``async with job.events() as stream: async for event in stream: ...``. When
        the stream is entered (or first read) it gets the job's last 1000 events
        recorded so far, then each new one as it comes; iteration ends once the job
        has ended (or the ``open_job`` block is left) and the stream is drained, so a
        subscriber entered late, even after the block, misses nothing kept. The job
        never waits for a reader: see :class:`aelastic.events._subscribe.EventStream` for
        ``max_buffer`` and ``dropped``. A stream never used costs nothing.
        """
        from ..events._subscribe import EventStream

        return EventStream(
            None,
            max_buffer,
            "drop_oldest",
            self.run_id,
            attach=self._attach_events,
            detach=self._event_streams_remove,
        )

    async def stop(self) -> None:
        """Stop the job and return once it has stopped; a job already done is left as is.

        As when the ``open_job`` block is left: the workers get SIGTERM (SIGKILL after
        the shutdown timeout) and the node leaves the rendezvous (bounded). Then
        :meth:`wait` raises :class:`JobStoppedError`, :attr:`history` ends with
        ``STOPPED``, and the health endpoint answers until the block is left.
        Cancelling ``stop()`` only ends the waiting: the job stops all the same.
        """
        if not self._done.is_set():
            self._stop_requested = True
            self._run_scope.cancel()
        await self._done.wait()

    def send_signal(self, sig: int, *, terminate: bool = True) -> None:
        """Stop the job with ``sig`` (``terminate=True``) or only forward it to the workers.

        See :meth:`aelastic.agent.SimpleElasticAgent.send_signal`: with ``terminate``
        the workers get ``sig`` (SIGKILL after the shutdown timeout) and :meth:`wait`
        raises :class:`aelastic.agent.SignalException`; without, the running workers'
        process groups get ``sig`` (e.g. SIGUSR1 as a preemption notice) and the job
        goes on. Never blocks.

        Raises:
            JobSignalError: ``sig`` is not a signal number of this platform (nothing
                is sent; also a ``ValueError``).
        """
        try:
            number = signal.Signals(sig)
        except ValueError:
            raise JobSignalError(
                f"send_signal({sig!r}): not a signal number on this platform; pass a "
                "signal.Signals member such as signal.SIGTERM or signal.SIGUSR1"
            ) from None
        self._agent.send_signal(number, terminate=terminate)
        if terminate and self._entering and self._entry_signal is None:
            # no worker yet, the agent's run not begun: end the wait for the store now
            self._entry_signal = number
            self._run_scope.cancel()

    async def wait(self) -> dict[int, Any]:
        """Wait for the job to end; return ``{global_rank: return value}`` of this node.

        Cancelling the wait (a timeout around it) only stops waiting: the job goes on
        running and a later ``wait()`` still gets its outcome. The job stops when its
        ``open_job`` block is left, so a cancellation that also leaves the block (the
        usual case for a cancelled task group) stops it then.

        Raises:
            aelastic.errors.ChildFailedError: a worker failed and the restart budget
                is spent.
            aelastic.rendezvous.RendezvousGracefulExitError: the rendezvous let this
                node go without running the job to its end (a spare node of a job that
                ended): nothing failed, but nothing here completed either.
            aelastic.rendezvous.RendezvousError: the rendezvous failed.
            aelastic.workers.WorkerStartError: a worker could not be started.
            aelastic.agent.SignalException: :meth:`send_signal` stopped the job.
            JobStoppedError: the ``open_job`` block was left (or cancelled) first.
        """
        await self._done.wait()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return _result_values(outcome, self.name)

    # -- the agent's side -------------------------------------------------------------

    def _on_state(self, group: WorkerGroup, previous: WorkerState) -> None:
        self._take_failures()
        self._push(group.state, previous)

    def _push(self, state: WorkerState, previous: WorkerState | None) -> None:
        agent = self._agent
        self._history.append(
            StateChange(
                state=state,
                previous=previous,
                round=agent.rendezvous_round,
                attempt=agent.attempt,
                restart_count=self.restart_count,
                remaining_restarts=agent.remaining_restarts,
                timestamp=time.time(),
            )
        )
        self._changes += 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _take_failures(self) -> None:
        """Note the failure the agent published, if new (at most once per failed round).

        Called at each transition, so a failure is noted with the attempt it ended
        (the agent publishes it before leaving ``FAILED``, and the next attempt starts
        after that), and when read.
        """
        failures = self._agent.last_failures
        if failures is self._failures_seen or not failures:
            return
        self._failures_seen = failures
        global_rank, failure = min(failures.items(), key=lambda item: item[1].local_rank)
        self._last_failure = FailureInfo(
            local_rank=failure.local_rank,
            global_rank=global_rank,
            pid=failure.pid,
            exitcode=failure.exitcode,
            attempt=self._agent.attempt,
            timestamp=time.time(),
        )

    async def _watch_events(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Take this job's events (backlog, subscribers, progress notes) until cancelled;
        subscribed before ``started``, so the job's first event is seen."""
        from ..events import subscribe

        async with subscribe(run_id=self.run_id, max_buffer=_EVENT_BUFFER) as stream:
            self._events_source = stream
            task_status.started()
            try:
                async for event in stream:
                    self._take_event(event)
            finally:
                self._end_events()

    def _take_event(self, event: Any) -> None:
        self._event_backlog.append(event)
        for subscriber in self._event_streams:
            subscriber.push(event, "")
        name = getattr(event, "name", None)
        metadata = getattr(event, "metadata", None) or {}
        if name == "aelastic.progress.hang":
            self._note_hang(metadata)
        elif name == "aelastic.progress.learned_timeouts":
            heartbeat = metadata.get("heartbeat")
            if heartbeat is not None:
                self.learned_heartbeat_timeout = float(heartbeat)
        elif name in _VIEW_MARKS and self.status_publisher is not None:
            # on the job view's time axis, with the gate's reason
            self.status_publisher.note(_VIEW_MARKS[name], str(metadata.get("reason", "")))

    def _end_events(self) -> None:
        """Take what the job's subscription holds, then end every subscriber's stream.

        Called when the job is done (its events were all recorded, hence pushed, by
        then) and when the event task ends; idempotent.
        """
        source = self._events_source
        while source is not None:
            try:
                self._take_event(source.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        self._events_ended = True
        for subscriber in list(self._event_streams):
            subscriber.close()

    def _attach_events(self, stream: EventStream) -> None:
        for event in self._event_backlog:
            stream.push(event, "")
        if self._events_ended:
            stream.close()  # the backlog is all there is
        else:
            self._event_streams.append(stream)

    def _event_streams_remove(self, stream: EventStream) -> None:
        if stream in self._event_streams:
            self._event_streams.remove(stream)

    def _note_hang(self, metadata: Mapping[str, Any]) -> None:
        global_rank = metadata.get("global_rank")
        section = metadata.get("section")
        stacks_file = metadata.get("stacks_file")
        self._last_hang = HangInfo(
            global_rank=None if global_rank is None else int(global_rank),
            local_rank=int(metadata.get("local_rank", -1)),
            pid=int(metadata.get("pid", -1)),
            rule=str(metadata.get("rule")),
            section=None if section is None else str(section),
            timeout=float(metadata.get("timeout") or 0.0),
            stacks_file=None if stacks_file is None else str(stacks_file),
            stacks_captured=int(metadata.get("stacks_captured") or 0),
            step=int(metadata.get("step", -1)),
            detected_at=float(metadata.get("detected_at") or 0.0),
        )
        self.hang_count += 1
        self.stacks_captured += self._last_hang.stacks_captured

    async def _run(self) -> None:
        """Run the agent in its handler; keep the outcome for :meth:`wait`.

        Cancellation (the block left, :meth:`stop`) stops the workers and leaves the
        rendezvous (the agent's shielded, bounded shutdown), then propagates (a
        :meth:`stop` ends here). A job that ends before its group ever changed state
        (stopped or failed during its first rendezvous) leaves ``INIT`` for ``STOPPED``
        (``UNKNOWN`` after an error), so its last transition says how it ended.

        Every path that runs a job (``launch``, ``elastic_launch``, ``launch_agent``,
        ``open_job``, ``aelastic run``) comes here: the agent's final status event
        (torch's ``torchelastic.worker.status.SUCCEEDED``/``FAILED``, source AGENT) is
        recorded here, once, to the config's ``event_log_handler``, before the job's
        event streams end.
        """
        with self._run_scope:
            try:
                self._entering = True
                async with self._prepared.handler:
                    self._entering = False
                    if self.status_publisher is not None:
                        self.status_publisher.wake()  # visible while it waits for peers
                    self._outcome = await self._agent.run()
                    if self._want_end_view and self.status_publisher is not None:
                        self._end_view = await self.status_publisher.end_view()  # bounded
            except anyio.get_cancelled_exc_class():
                sig = self._entry_signal
                if sig is not None and not self._stop_requested:
                    from ..agent import SignalException

                    self._outcome = SignalException(
                        f"job {self.run_id!r} got {sig.name} while joining its rendezvous",
                        sig,
                        workers_started=False,
                    )
                    raise
                how = (
                    "job.stop() was called"
                    if self._stop_requested
                    else "its open_job block was left or cancelled"
                )
                self._outcome = JobStoppedError(
                    f"job {self.run_id!r} was stopped before it finished: {how}"
                )
                raise
            except Exception as exc:
                self._outcome = exc
            finally:
                self._entering = False
                outcome = self._outcome
                if outcome is None:  # a BaseException such as KeyboardInterrupt
                    outcome = JobStoppedError(f"job {self.run_id!r} was interrupted")
                    self._outcome = outcome
                # torch's launch_agent: one AGENT status event, SUCCEEDED when the run
                # returned (even with failed workers), FAILED when it raised or stopped
                error = outcome if isinstance(outcome, BaseException) else None
                self._agent.record_status(error)
                self._leave_init()
                self._agent.get_worker_group().remove_state_listener(self._on_state)
                self._take_failures()
                self._done.set()
                self._changed.set()
                self._end_events()

    def _leave_init(self) -> None:
        """Give a group that never left ``INIT`` the state it ended in (see :meth:`_run`)."""
        from ..agent import WorkerState

        group = self._agent.get_worker_group()
        if group.state is WorkerState.INIT:
            outcome = self._outcome
            failed = isinstance(outcome, BaseException) and not isinstance(outcome, JobStoppedError)
            group.state = WorkerState.UNKNOWN if failed else WorkerState.STOPPED


def _result_values(result: RunResult, name: str) -> dict[int, Any]:
    from ..agent import WorkerState
    from ..errors import ChildFailedError
    from ..rendezvous import RendezvousGracefulExitError

    if result.is_failed():
        if result.no_progress:
            from ..agent import NoProgressError

            raise NoProgressError(name, result.failures, notes=result.notes)
        raise ChildFailedError(name, result.failures, notes=result.notes)
    if result.state is WorkerState.STOPPED:
        raise RendezvousGracefulExitError(
            "the rendezvous let this node go before the job ended (it was a spare node "
            "of a job that finished or closed): no worker ran to completion here"
        )
    return dict(result.return_values)


@asynccontextmanager
async def open_job(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str, *args: Any
) -> AsyncIterator[Job]:
    """Start this node's part of a job and yield a :class:`Job` handle on it.

    ``async with open_job(config, sys.executable, "-u", "train.py") as job:``. The
    settings are checked and, with ``config.health_port`` set, the health endpoint is
    listening before the block is entered; the rendezvous and the workers start at
    the block's first checkpoint, in a task of their own (the job's failure does not
    cancel the block: :meth:`Job.wait` reports it).

    Leaving the block (normally, by an exception or by cancellation) stops a job that
    is still running: the workers get SIGTERM (SIGKILL after the shutdown timeout),
    the node leaves the rendezvous (bounded), the health endpoint closes. Nothing
    process-wide changes (no signal handler, no ``os.environ`` write).

    Raises:
        LaunchConfigError: a setting cannot work (raised on entry, nothing started).
        aelastic.health.HealthPortError: the health port cannot be bound (also an
            ``OSError``); the message names the port and the fix.
    """
    await import_off_loop(job_modules(config))
    prepared = prepare_job(config, entrypoint, args)
    job = Job(config, prepared)
    async with background_tasks() as tg:
        if config.health_port is not None:
            job.health_address = await _start_health(tg, job, config)
        await tg.start(job._watch_events)
        await _start_status(tg, job, prepared)
        await _start_stragglers(tg, job, prepared)
        await _start_trainer_status(tg, job)
        tg.start_soon(job._run, name=f"aelastic job {job.run_id}")
        yield job


async def _start_status(tg: anyio.abc.TaskGroup, job: Job, prepared: PreparedJob) -> None:
    """Publish this node's status into the rendezvous store (``aelastic status``)."""
    from ..jobview._publish import StatusPublisher

    job.status_publisher = StatusPublisher(job, prepared.handler)
    await tg.start(job.status_publisher.run)


async def _start_trainer_status(tg: anyio.abc.TaskGroup, job: Job) -> None:
    """Post progress to Kubeflow Trainer's status server when the pod was given one
    (``KUBEFLOW_TRAINER_SERVER_URL``): from the node of group rank 0 only, never
    holding the job (``aelastic.schedulers``, ``docs/kubernetes.md``)."""
    if not os.environ.get("KUBEFLOW_TRAINER_SERVER_URL"):
        return  # not a TrainJob's pod: nothing imported (job_modules imports it otherwise)
    from ..schedulers._kubeflow import TrainerStatusPoster, TrainerStatusTarget

    target = TrainerStatusTarget.from_env()
    if target is None:
        return

    def step() -> int | None:  # the newest step every local worker completed
        steps = [s.step for s in job.progress().values() if s.attached]
        return min(steps) if steps else None

    def goodput() -> float | None:
        summary = job.goodput()
        ratio = None if summary is None else summary.get("ratio")
        return float(ratio) if isinstance(ratio, (int, float)) else None

    poster = TrainerStatusPoster(target, step, goodput, posting=lambda: job.group_rank == 0)
    await tg.start(poster.run)


async def _start_stragglers(tg: anyio.abc.TaskGroup, job: Job, prepared: PreparedJob) -> None:
    """Watch this node's workers for stragglers (on unless ``straggler_action="off"``)."""
    from ..jobview._keys import status_store
    from ..nodes._exclusion import NODE_ID_ENV
    from ..stragglers._watch import StragglerWatch
    from ._straggler_args import settings_of

    settings = settings_of(job.config)
    publisher = job.status_publisher
    if not settings.enabled or publisher is None:
        return
    handler = prepared.handler
    emit = job._agent._emit

    async def exclude(reason: str) -> None:
        gate = prepared.node_gate
        if gate is not None and await gate.exclude(reason, handler, emit):
            # the workers' failure becomes a free restart that sits out the exclusion
            # (NodeGate.review, NodeGate.admit); a spare takes this node's group rank
            job._agent.send_signal(signal.SIGTERM, terminate=False)

    job.straggler_watch = StragglerWatch(
        settings,
        job,
        lambda: status_store(handler),
        node=os.environ.get(NODE_ID_ENV) or publisher.node,
        host=job.node,
        emit=emit,
        mark=publisher.note,
        exclude=exclude,
        charge=lambda seconds: job._agent.goodput.charge("straggler", seconds),
    )
    await tg.start(job.straggler_watch.run)


async def _start_health(tg: anyio.abc.TaskGroup, job: Job, config: LaunchConfig) -> tuple[str, int]:
    """Listen for the health endpoint in ``tg`` (raises ``HealthPortError``)."""
    from ..health._server import serve_health
    from ..jobview._http import JOBVIEW_PATHS, jobview_route

    def job_view(method: str, path: str) -> Response | Awaitable[Response] | None:
        if path not in JOBVIEW_PATHS:
            return None
        return jobview_route(job.status_publisher, path)  # the whole job's live page

    address: tuple[str, int] = await tg.start(
        partial(serve_health, extra_route=job_view), job, config.health_host, config.health_port
    )
    return address


async def run_job(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    *args: Any,
    task_status: anyio.abc.TaskStatus[Job] = anyio.TASK_STATUS_IGNORED,
) -> dict[int, Any]:
    """Run a job as a task: ``job = await task_group.start(run_job, config, entrypoint, *args)``.

    ``start`` returns the :class:`Job` once its workers are up (the first ``HEALTHY``)
    and raises what the job raised if it ended before (a rendezvous error...). The
    task then lasts as long as the job and ends as :meth:`Job.wait` does: a failure
    (``ChildFailedError``...) propagates into the task group, like any task's.
    Cancelling the task group stops the job.
    """
    from ..agent import WorkerState

    async with open_job(config, entrypoint, *args) as job:
        async with aclosing(job.state_changes()) as changes:
            async for change in changes:
                if change.state is WorkerState.HEALTHY:
                    task_status.started(job)
                    break
        return await job.wait()
