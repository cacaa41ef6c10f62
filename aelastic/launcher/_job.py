"""``open_job``: a handle on one node's job running in the caller's event loop.

``async with aelastic.open_job(config, entrypoint, *args) as job:`` starts the node
(rendezvous, workers, restarts) in a task of its own and hands back a :class:`Job`:
its live state, the state transitions as they happen (pushed by the agent, never
polled), this job's events, its workers, signal forwarding and ``await job.wait()``.
Leaving the block stops the job. ``job = await task_group.start(run_job, config,
entrypoint, *args)`` is the same, returned once the workers are up. Never imports torch.

:class:`Job` here is the part that runs (its task, stop, signals, ``wait``); what it says
about itself is in ``_job_view`` (its state and accessors), ``_job_events`` (its
transitions and events as streams) and ``_job_records`` (the records it hands out).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._tasks import background_tasks
from ._build import PreparedJob, prepare_job
from ._config import LaunchConfig
from ._exceptions import JobSignalError, JobStoppedError, LaunchConfigError
from ._job_events import JobEvents
from ._job_records import FailureInfo as FailureInfo
from ._job_records import HangInfo as HangInfo
from ._job_records import StateChange as StateChange
from ._job_records import WorkerInfo as WorkerInfo
from ._preimport import import_off_loop, job_modules

if TYPE_CHECKING:
    from ..agent import RunResult
    from ..health._http import Response

__all__ = (
    "FailureInfo",
    "HangInfo",
    "Job",
    "StateChange",
    "WorkerInfo",
    "open_job",
    "run_job",
)

#: The buffer of the job's own subscription, drained by its event task.
_EVENT_BUFFER = 10_000


class Job(JobEvents):
    """A handle on one node's job; made by :func:`open_job` (do not construct it).

    Every method is called from the event loop running the job; none blocks.
    """

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
                        # bounded; not waited for when the peers' workers still run
                        # (the exit barrier timed out): their final ledgers come later
                        self._end_view = await self.status_publisher.end_view(
                            peers_running=self._agent._peers_still_running
                        )
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
    settings are checked and, with ``config.health.port`` set, the health endpoint is
    listening before the block is entered; the rendezvous and the workers start at
    the block's first checkpoint, in a task of their own (the job's failure does not
    cancel the block: :meth:`Job.wait` reports it).

    Leaving the block (normally, by an exception or by cancellation) stops a job that
    is still running: the workers get SIGTERM (SIGKILL after the shutdown timeout),
    the node leaves the rendezvous (bounded), the health endpoint closes. Nothing
    process-wide changes (no signal handler, no ``os.environ`` write).

    Raises:
        LaunchConfigError: a setting cannot work (raised on entry, nothing started).
        OSError: the health port cannot be bound (a private ``HealthPortError``, also
            an ``AelasticError``); the message names the port and the fix.
    """
    async with _open_job(config, entrypoint, args) as job:
        yield job


@asynccontextmanager
async def _open_job(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
    worker_ignored_signals: Collection[int] = (),
) -> AsyncIterator[Job]:
    """:func:`open_job`, whose workers start with ``worker_ignored_signals`` ignored
    (``aelastic run``'s SIGUSR1 while it traps the preemption notice)."""
    await import_off_loop(job_modules(config))
    prepared = prepare_job(config, entrypoint, args, worker_ignored_signals)
    await _check_paths(config)
    job = Job(config, prepared)
    async with background_tasks() as tg:
        if config.health.port is not None:
            job.health_address = await _start_health(tg, job, config)
        await tg.start(job._watch_events)
        await _start_status(tg, job, prepared)
        await _start_stragglers(tg, job, prepared)
        await _start_trainer_status(tg, job)
        tg.start_soon(job._run, name=f"aelastic job {job.run_id}")
        yield job


async def _check_paths(config: LaunchConfig) -> None:
    """The files the settings name (the checkpoint directory, created; the job secret,
    read), checked in a thread before anything starts.

    Raises:
        LaunchConfigError: one that cannot be used (the message names the flag and the fix).
    """
    from ..checkpoint import CheckpointError
    from ..checkpoint._disk import check_paths

    try:
        await anyio.to_thread.run_sync(check_paths, config.checkpoints)
    except CheckpointError as exc:
        raise LaunchConfigError(str(exc)) from None


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
    """Watch this node's workers for stragglers (on unless ``stragglers.action="off"``)."""
    from ..jobview._keys import status_store
    from ..nodes._exclusion import NODE_ID_ENV
    from ..stragglers._watch import StragglerWatch

    settings = job.config.stragglers
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
        partial(serve_health, extra_route=job_view), job, config.health.host, config.health.port
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
