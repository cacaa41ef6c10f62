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
import signal
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._exceptions import AelasticError
from ._build import PreparedJob, prepare_job
from ._config import LaunchConfig

if TYPE_CHECKING:
    from ..agent import RunResult, WorkerGroup, WorkerState
    from ..errors import ProcessFailure
    from ..events import EventStream

__all__ = (
    "FailureInfo",
    "HangInfo",
    "Job",
    "JobSignalError",
    "JobStoppedError",
    "StateChange",
    "WorkerInfo",
    "open_job",
    "run_job",
)

#: State transitions a :class:`Job` keeps for late readers of :meth:`Job.state_changes`.
_HISTORY = 1_000


class JobStoppedError(AelasticError):
    """The job was stopped before it finished: its ``open_job`` block was left or cancelled."""


class JobSignalError(AelasticError, ValueError):
    """:meth:`Job.send_signal` was given a number that is not a signal of this platform.

    Also a ``ValueError`` (what ``signal.Signals(n)`` raises), so existing handlers work.
    """


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
        self.node = socket.gethostname()
        self._prepared = prepared
        self._agent = prepared.agent
        self._history: collections.deque[StateChange] = collections.deque(maxlen=_HISTORY)
        self._changes = 0  # transitions ever recorded (the index after the last one)
        self._changed = anyio.Event()
        self._done = anyio.Event()
        self._outcome: RunResult | BaseException | None = None
        self._last_failure: FailureInfo | None = None
        #: the agent's ``last_failures`` mapping ``_last_failure`` was made from
        self._failures_seen: Mapping[int, ProcessFailure] = self._agent.last_failures
        self._last_hang: HangInfo | None = None
        #: hangs found and stacks written so far (from the job's own events)
        self.hang_count = 0
        self.stacks_captured = 0
        #: the heartbeat timeout ``learn_timeouts`` learned, in seconds (None: none yet)
        self.learned_heartbeat_timeout: float | None = None
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
        from ..agent._policy import restart_count

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

    def node_health(self) -> dict[str, Any] | None:
        """The last health check pass before a round (``/status``'s ``node_health``):
        ``{"healthy", "checked_at", "strikes", "checks": [...]}``; None: no checks."""
        gate = self._agent.node_gate
        report = None if gate is None else gate.report
        return None if report is None else report.as_dict()

    def unhealthy_reason(self) -> str | None:
        """Why this node is kept out of the job (a failed health check), else None."""
        gate = self._agent.node_gate
        if gate is None or gate.report is None or gate.report.healthy:
            return None
        return gate.report.reason()

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
        """Subscribe to this job's events only (those whose run id is :attr:`run_id`).

        ``async with job.events() as stream: async for event in stream: ...``; see
        :func:`aelastic.events.subscribe`: events recorded from the moment the stream
        is entered (or first read) on; a stream never used subscribes to nothing.
        """
        from ..events import subscribe

        return subscribe(run_id=self.run_id, max_buffer=max_buffer)

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

    async def _watch_progress(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep what this job's progress events say (hangs, learned timeouts) until
        cancelled; subscribed before ``started``, so the job's first event is seen."""
        from ..events import subscribe

        async with subscribe(run_id=self.run_id, max_buffer=1000) as stream:
            task_status.started()
            async for event in stream:
                name = getattr(event, "name", None)
                metadata = getattr(event, "metadata", None) or {}
                if name == "aelastic.progress.hang":
                    self._note_hang(metadata)
                elif name == "aelastic.progress.learned_timeouts":
                    heartbeat = metadata.get("heartbeat")
                    if heartbeat is not None:
                        self.learned_heartbeat_timeout = float(heartbeat)

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

        Cancellation (the block left) stops the workers and leaves the rendezvous
        (the agent's shielded, bounded shutdown), then propagates.
        """
        try:
            async with self._prepared.handler:
                self._outcome = await self._agent.run()
        except anyio.get_cancelled_exc_class():
            self._outcome = JobStoppedError(
                f"job {self.run_id!r} was stopped before it finished: its open_job block "
                "was left or cancelled"
            )
            raise
        except Exception as exc:
            self._outcome = exc
        finally:
            if self._outcome is None:  # a BaseException such as KeyboardInterrupt
                self._outcome = JobStoppedError(f"job {self.run_id!r} was interrupted")
            self._agent.get_worker_group().remove_state_listener(self._on_state)
            self._take_failures()
            self._done.set()
            self._changed.set()


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
        OSError: the health port cannot be bound.
    """
    prepared = prepare_job(config, entrypoint, args)
    job = Job(config, prepared)
    error: BaseException | None = None  # raised after the task group, which would wrap it
    async with anyio.create_task_group() as tg:
        try:
            if config.health_port is not None:
                job.health_address = await _start_health(tg, job, config)
            await tg.start(job._watch_progress)
            tg.start_soon(job._run, name=f"aelastic job {job.run_id}")
            yield job
        except BaseException as exc:
            error = exc
        finally:
            tg.cancel_scope.cancel()
    if error is not None:
        raise error


async def _start_health(tg: anyio.abc.TaskGroup, job: Job, config: LaunchConfig) -> tuple[str, int]:
    """Listen for the health endpoint in ``tg``; an unusable port is named with the fix."""
    from ..health import serve_health

    host, port = config.health_host, config.health_port
    try:
        address: tuple[str, int] = await tg.start(serve_health, job, host, port)
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"health endpoint: cannot listen on {host}:{port}: {exc.strerror or exc}; choose "
            "another health_port (--health-port), or 0 for any free port",
        ) from None
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
