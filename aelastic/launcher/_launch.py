"""``await launch(config, entrypoint, *args)``: run one node of a job in the current event loop.

A thin layer over :func:`aelastic.open_job` (the job handle); ``elastic_launch`` and
``launch_agent`` are its synchronous forms.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any

import anyio

from .._tasks import background_tasks
from ..agent import SignalException
from ..goodput import combine
from ..goodput._ledger import Ledger
from ..rendezvous._c10d import C10dRendezvousHandler
from ..workers._console import console_writer
from ._build import entrypoint_name, parse_signals
from ._config import LaunchConfig
from ._job import Job, _open_job
from ._preemption import NOTICE, persisted_step, requeue, trapped_signals

__all__ = ("elastic_launch", "entrypoint_name", "launch", "launch_agent", "run_launch")

log = logging.getLogger(__name__)


async def run_launch(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
    *,
    handle_signals: bool = False,
    say: Callable[[str], None] | None = None,
    goodput_line: bool = False,
) -> dict[int, Any]:
    """:func:`launch`, optionally trapping ``config.signals_to_handle`` (the CLI's path).

    ``say`` (the CLI's): called with a line that says where to look at the job when
    a port was picked at start (``--health-port 0``, ``--standalone``'s store).

    With ``handle_signals`` the process's handlers for those signals are replaced while
    the launch runs (only the main thread may do this): each received signal makes the
    agent stop its workers with that signal, and :class:`aelastic.agent.SignalException`
    is raised once they are gone; a SIGUSR1 trapped as the preemption notice
    (``--checkpoint-dir``) is ignored by the workers, which start with it ignored (a
    script's own handler still gets it). With ``goodput_line`` the job's goodput ledger (every
    node's, read from the status store at the end: at most 3 s more; this node's when
    it cannot be read) is printed to stderr as one line when the job ends, however it
    ends.
    """
    signals = parse_signals(config.signals_to_handle) if handle_signals else []
    notice = False
    if signals:
        signals, notice = trapped_signals(signals, config.checkpoints.dir)
    # the notice is the agent's: the workers, which Slurm signals too, start ignoring it
    ignored = (NOTICE,) if notice else ()
    async with _open_job(config, entrypoint, args, ignored) as job, background_tasks() as tg:
        job._want_end_view = goodput_line
        if say is not None:
            tg.start_soon(_say_where, job, say)
        try:
            if not signals:
                return await job.wait()
            noticed: list[signal.Signals] = []
            try:
                return await _wait_forwarding(job, signals, noticed if notice else None)
            except SignalException as exc:
                with anyio.open_signal_receiver(*signals):  # more signals wait, bounded
                    await _after_preemption(config, exc, bool(noticed))
                raise
        finally:
            line = _end_line(job) if goodput_line else None
            if line is not None:  # queued: a stalled stderr must not hold the exit
                console_writer("stderr").write(f"aelastic: {line}\n".encode())


def _end_line(job: Job) -> str | None:
    """The job's goodput line (:func:`end_line`)."""
    alone = job.config.max_nodes <= 1
    return end_line(job._end_view, job._agent.goodput.ledger(), alone)


def end_line(view: dict[str, Any] | None, own: Ledger | None, alone: bool = False) -> str | None:
    """The goodput line a node prints at the end of ``aelastic run``: the job's, from
    ``view`` (every node's final ledger: ``StatusPublisher.end_view``) when it has
    more than one node, else this node's own ledger ``own`` (a one-node job, or the
    view could not be read: then it says so unless the job is ``alone``, one node at
    most). None: no ledger at all."""
    records = [] if view is None else [n.get("goodput") for n in view["nodes"]]
    known = [r for r in records if isinstance(r, dict)]
    if len(known) > 1:
        ledger = combine(known)
        if ledger is not None:
            return ledger.summary(f"the job's, {len(known)} nodes")
    if own is None:
        return None
    if view is None and not alone:
        return own.summary("this node's: the job's view could not be read at the end")
    return own.summary()


async def _say_where(job: Job, say: Callable[[str], None]) -> None:
    """Say where to look at the job when the system picked the port: the health endpoint
    of ``--health-port 0``, and the rendezvous store this node hosts on a port picked at
    start (``--standalone``), with the run id and the ``aelastic status`` command."""
    if job.health_address is not None and job.config.health.port == 0:
        host, port = job.health_address
        shown = f"[{host}]" if ":" in host else host
        say(f"health endpoint at http://{shown}:{port}/ (--health-port 0 picked port {port})")
    handler = job._prepared.handler
    if not isinstance(handler, C10dRendezvousHandler) or handler.port != 0:
        return
    async with aclosing(job.state_changes()) as changes:
        async for _ in changes:  # the store is up once the handler was entered
            server = handler.server
            if server is not None:
                say(
                    f"run id {job.run_id}, rendezvous store at {server.address}; see it with "
                    f"python -m aelastic status --rdzv-endpoint {server.address} "
                    f"--rdzv-id {job.run_id}"
                )
                return


async def _after_preemption(config: LaunchConfig, exc: SignalException, noticed: bool) -> None:
    """A signal stopped the job (the agent persisted on its way out): record the step
    ``--checkpoint-dir`` now holds on ``exc`` after a preemption signal (SIGTERM, the
    notice), and requeue the Slurm job after the notice with ``--requeue``. Bounded
    (one small read, ``scontrol`` by its timeout); errors are logged, never raised."""
    if exc.sigval == signal.SIGTERM or noticed:
        exc.persisted_step = await anyio.to_thread.run_sync(persisted_step, config.checkpoints.dir)
        if exc.persisted_step is not None:
            log.warning(
                "preempted (%s): step %d is in %s; a fresh start resumes there",
                NOTICE.name if noticed else exc.sigval.name,
                exc.persisted_step,
                config.checkpoints.dir,
            )
    if noticed and config.checkpoints.requeue:
        await requeue(os.environ)


async def _wait_forwarding(
    job: Job, signals: list[signal.Signals], noticed: list[signal.Signals] | None = None
) -> dict[int, Any]:
    """``job.wait()`` while every signal of ``signals`` received is sent to the job.

    With ``noticed`` (a list), :data:`NOTICE` is the preemption notice: it is appended
    there and the job is stopped with SIGTERM (the workers' usual stop signal)."""
    outcome: list[dict[int, Any] | Exception] = []
    with anyio.open_signal_receiver(*signals) as received:
        async with anyio.create_task_group() as tg:

            async def forward() -> None:
                async for sig in received:
                    if noticed is not None and sig == NOTICE:
                        if not noticed:
                            log.warning("%s: preemption notice; stopping the workers", sig.name)
                        noticed.append(sig)
                        sig = signal.SIGTERM
                    job.send_signal(sig)

            tg.start_soon(forward)
            try:
                outcome.append(await job.wait())
            except Exception as exc:  # raised below, outside the task group
                outcome.append(exc)
            tg.cancel_scope.cancel()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


async def launch(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str, *args: Any
) -> dict[int, Any]:
    """Run this node's workers of a job and return ``{global_rank: return value}``.

    ``entrypoint`` is a binary or script path run as ``[entrypoint, *args]`` (return
    values are None), or a module-level callable run in a fresh interpreter (its
    return value must be JSON-serialisable). Joins the rendezvous ``config`` describes,
    restarts the group on failures (``max_restarts``) and on membership changes.
    ``async with open_job(config, entrypoint, *args) as job: return await job.wait()``:
    use :func:`aelastic.open_job` to watch or steer the job while it runs.

    Nothing process-global changes: no signal handler, no ``os.environ`` write
    (``TORCHELASTIC_SIGNALS_TO_HANDLE`` goes to the workers' environment only). Two
    launches may run concurrently in one event loop.

    Cancellation stops the workers (signal, then SIGKILL after the shutdown timeout),
    leaves the rendezvous and re-raises.

    Raises:
        aelastic.errors.ChildFailedError: a worker failed and the restart budget is spent.
        aelastic.rendezvous.RendezvousGracefulExitError: the rendezvous let this node go
            before the job ended (a spare node of a job that finished): nothing failed,
            but nothing completed here either (the CLI exits 0).
        aelastic.rendezvous.RendezvousError: the rendezvous failed (timeout, closed, ...).
        aelastic.workers.WorkerStartError: a worker could not be started (a missing
            binary, a bad working directory).
        LaunchConfigError: the configuration cannot work.
    """
    return await run_launch(config, entrypoint, args)


class elastic_launch:
    """``elastic_launch(config, entrypoint)(*args)``: :func:`launch` for synchronous callers.

    Runs its own event loop (``anyio.run``) and returns ``{global_rank: return value}``
    or raises as :func:`launch` does.

    Raises:
        RuntimeError: called from inside a running event loop; ``await launch(...)``
            there instead.
    """

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str) -> None:
        self._config = config
        self._entrypoint = entrypoint

    def __call__(self, *args: Any) -> dict[int, Any]:
        import sniffio

        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            pass
        else:
            raise RuntimeError(
                f"elastic_launch(...)() was called inside a running {library} event loop, "
                "where it would block the loop; use 'await aelastic.launch(config, "
                "entrypoint, *args)' instead"
            )
        return anyio.run(partial(launch, self._config, self._entrypoint, *args))


def launch_agent(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str, args: Sequence[Any]
) -> dict[int, Any]:
    """torch's ``launch_agent(config, entrypoint, args)``: ``elastic_launch(...)(*args)``."""
    return elastic_launch(config, entrypoint)(*args)
