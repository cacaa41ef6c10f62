"""Worker processes: start, notice exits the moment they happen, stop, reap.

Each worker runs in its own session (so its process group id is its pid) and,
on Linux, with ``PR_SET_PDEATHSIG=SIGKILL`` so it dies with the agent even when
the agent is SIGKILLed. Exits arrive from a pidfd awaited with
:func:`anyio.wait_readable` (Linux >= 5.3; elsewhere a thread blocked in
``waitid``): no polling. Output that must be prefixed, tee'd or filtered flows
through a pipe into the agent (a reader task per pipe), which writes raw bytes
to the log file and whole lines to the console; everything else is wired
straight to the file or the inherited console. Runs on every anyio backend
(asyncio, uvloop, trio); a start forks one process per turn of the event loop.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Collection, Sequence

import anyio
import anyio.lowlevel

from ..errors import ProcessFailure
from ._background import BackgroundTasks, background_tasks
from ._console import wait_consoles_written
from ._exceptions import NoMoreExitsError, WorkerStartError
from ._exit_grace import (
    DEFAULT_EXIT_GRACE,
    EXIT_WARN_AFTER,
    IDLE_THREAD_SHARE,
    busiest_thread_seconds,
    receive_exit_notice,
    shutdown_report,
)
from ._output import ConsoleName, Sink
from ._pdeathsig import wrap_argv
from ._pipe_reader import OutputPipe
from ._procfs import process_state, thread_busy_seconds
from ._spec import ProcessExit, ProcessSpec
from ._std import Std
from ._warm import WarmPool
from ._watch import _watcher, exit_code_now, open_pidfd, wait_exit

__all__ = ("WorkerProcesses", "open_worker_processes")

log = logging.getLogger(__name__)

#: How long to wait for processes to die after SIGKILL before giving up on them.
DEFAULT_KILL_TIMEOUT = 5.0
#: How long to wait, once every process is dead, for their output pipes to drain.
_DRAIN_TIMEOUT = 2.0
#: Workers that survived SIGKILL: kept referenced so nothing warns about them later.
_abandoned: list[subprocess.Popen[bytes]] = []


class _Worker:
    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.pid = -1
        self.exited = anyio.Event()
        self.file_fds: list[int] = []
        self.popen: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.pipes: list[OutputPipe] = []
        # True once the pid was reaped: from then on it may belong to someone else.
        self.reaped = False
        # The exit status its script ended with (warm workers tell), and the status its
        # exit counts as once killed for not exiting after its work was done.
        self.ended_with: int | None = None
        self.script_status: int | None = None

    async def drained(self) -> None:
        for pipe in self.pipes:
            await pipe.done.wait()


class WorkerProcesses:
    """The live worker processes of one start, from :func:`open_worker_processes`.

    ``pids`` maps local rank to pid; ``exits`` holds every exit noticed so far
    (a worker is alive while its rank is absent). ``unreaped`` lists the
    processes that survived SIGKILL during :meth:`stop` (Linux D-state).

    An exited worker stays a zombie until the block ends (both exit watchers
    read its status with ``WNOWAIT``), so its pid, and thus its process group id, cannot be
    reused meanwhile: signalling the group of an exited worker reaches exactly
    the children it left behind, never a stranger.
    """

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        kill_timeout: float,
        warm_pool: WarmPool | None = None,
        exit_grace: float | None = DEFAULT_EXIT_GRACE,
        ignored_signals: Collection[int] = (),
    ) -> None:
        self.specs: dict[int, ProcessSpec] = {s.local_rank: s for s in specs}
        self._exit_grace = exit_grace if exit_grace is not None and exit_grace > 0 else None
        self._stopping = False
        self.pids: dict[int, int] = {}
        self.exits: dict[int, ProcessExit] = {}
        self.unreaped: dict[int, int] = {}
        self.watcher = _watcher()
        self._kill_timeout = kill_timeout
        self._workers: dict[int, _Worker] = {}
        self._pending: collections.deque[ProcessExit] = collections.deque()
        self._changed = anyio.Event()
        self._closed = False
        self._warm_pool = warm_pool
        self._ignored = frozenset(int(s) for s in ignored_signals)
        self._tg: BackgroundTasks | None = None
        # Threads that wait for exits when there is no pidfd: one per worker at most.
        self._limiter = anyio.CapacityLimiter(max(1, len(specs)))
        #: Local ranks whose worker is a pre-started (warm) interpreter.
        self.warm_ranks: set[int] = set()

    # -- observation -------------------------------------------------------

    def is_alive(self, local_rank: int) -> bool:
        """True while the worker of ``local_rank`` has started and not exited."""
        return local_rank in self._workers and local_rank not in self.exits

    @property
    def alive(self) -> dict[int, int]:
        """``{local_rank: pid}`` of the workers that have not exited."""
        return {r: w.pid for r, w in self._workers.items() if r not in self.exits}

    def states(self) -> dict[int, str]:
        """``{local_rank: state letter}`` of live workers from ``/proc`` (Linux).

        ``"D"`` (uninterruptible sleep) for long is what torch's
        ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT`` check looks for.
        Workers whose state cannot be read are left out.
        """
        result: dict[int, str] = {}
        for rank, pid in self.alive.items():
            state = process_state(pid)
            if state is not None:
                result[rank] = state
        return result

    def poll_exits(self) -> None:
        """Record now every worker that has exited but whose exit the loop has not delivered.

        Non-blocking (one ``waitid(WNOHANG | WNOWAIT)`` per live worker, nothing
        reaped); call it right before :meth:`stop` to tell workers that ended on
        their own from the ones the signal will end. Works with both watchers.
        """
        for rank, worker in self._workers.items():
            if rank in self.exits or worker.pid <= 0 or worker.reaped:
                continue
            try:
                code = exit_code_now(worker.pid)
            except ChildProcessError:  # reaped behind our back: status lost
                self._on_exit(rank, -1, reaped=True)
                continue
            if code is not None:
                self._on_exit(rank, code, reaped=False)

    async def wait_for_exit(self) -> ProcessExit:
        """Return the next exit not returned before, as soon as it happens.

        Raises :class:`NoMoreExitsError` once every worker's exit has been
        returned. Cancellation is safe: no exit is lost.
        """
        while not self._pending:
            if self._closed or not self.alive:
                raise NoMoreExitsError(
                    f"every exit of the {len(self._workers)} workers was already returned by"
                    " wait_for_exit (or the workers were closed); read"
                    " WorkerProcesses.exits instead"
                )
            await self._changed.wait()
        return self._pending.popleft()

    async def wait_all(self) -> dict[int, ProcessExit]:
        """Wait until every worker exited; returns ``{local_rank: ProcessExit}``."""
        for worker in list(self._workers.values()):
            await worker.exited.wait()
        return dict(self.exits)

    def failures(self) -> dict[int, ProcessFailure]:
        """``{local_rank: ProcessFailure}`` for every non-zero exit so far (reads error files)."""
        return {
            rank: ProcessFailure(
                local_rank=rank,
                pid=ex.pid,
                exitcode=ex.exitcode,
                error_file=self.specs[rank].error_file,
                exit_time=ex.timestamp,
            )
            for rank, ex in sorted(self.exits.items())
            if ex.failed
        }

    # -- control -----------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process group of every live worker (e.g. forward SIGUSR1)."""
        for rank, worker in self._workers.items():
            if rank not in self.exits:
                self._killpg(worker, sig)

    async def stop(
        self,
        sig: int = signal.SIGTERM,
        timeout: float = 30.0,  # noqa: ASYNC109 - a grace period, not a deadline of the call
    ) -> dict[int, ProcessExit]:
        """Stop every worker: ``sig`` to each process group, one shared deadline, SIGKILL.

        ``sig`` goes to the process group of every worker, also of workers
        that already exited (while their pid is still reserved, see the class
        docs), so children they left behind get it too. After ``timeout``
        seconds on one deadline for all, every group gets SIGKILL. Processes
        still not dead ``kill_timeout`` seconds later (uninterruptible, Linux
        D-state) are logged with advice, recorded in ``unreaped`` and
        abandoned: this method always returns. Returns ``exits``.

        Cancelling it cancels the waiting, not the signals already sent;
        :func:`open_worker_processes` calls it shielded on exit.
        """
        self._stopping = True
        if not self._workers:
            return dict(self.exits)
        for worker in self._workers.values():
            self._killpg(worker, sig)
        if sig != signal.SIGKILL and self.alive:
            with anyio.move_on_after(timeout):
                await self.wait_all()
            for rank, pid in self.alive.items():
                log.warning(
                    "worker local_rank=%s (pid %s) did not exit within %.1fs of %s;"
                    " sending SIGKILL",
                    rank,
                    pid,
                    timeout,
                    signal.Signals(sig).name,
                )
        for worker in self._workers.values():
            self._killpg(worker, signal.SIGKILL)
        if self.alive:
            with anyio.move_on_after(self._kill_timeout):
                await self.wait_all()
        for rank, pid in self.alive.items():
            self.unreaped[rank] = pid
            log.error(
                "worker local_rank=%s (pid %s) survived SIGKILL for %.1fs; it is probably in"
                " uninterruptible sleep (state D in /proc/%s/stat: a hung GPU, NCCL, RDMA or"
                " network file system call). Giving up on it; recycle this host.",
                rank,
                pid,
                self._kill_timeout,
                pid,
            )
        return dict(self.exits)

    # -- internals ---------------------------------------------------------

    @staticmethod
    def _killpg(worker: _Worker, sig: int) -> None:
        if worker.pid <= 0 or worker.reaped:
            # A reaped pid may already name another process group.
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, sig)

    def _on_exit(self, local_rank: int, exitcode: int, *, reaped: bool) -> None:
        worker = self._workers.get(local_rank)
        if worker is None or local_rank in self.exits:
            return
        worker.reaped = reaped
        exit_ = ProcessExit(local_rank, worker.pid, exitcode, time.time())
        self.exits[local_rank] = exit_
        self._pending.append(exit_)
        worker.exited.set()
        self._wake()
        if exitcode == 0 and self._exit_grace is not None and not self._stopping:
            codes = [e.exitcode for e in self.exits.values()]
            alive = [w for r, w in self._workers.items() if r not in self.exits]
            if alive and codes == [0] and self._tg is not None:
                # The first success: from now on, a worker that sits idle is done.
                for other in alive:
                    self._tg.start_soon(self._bound_idle_after_peers, other, self._exit_grace)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _start_all(self, specs: Sequence[ProcessSpec]) -> None:
        for spec in specs:
            worker = _Worker(spec)
            self._workers[spec.local_rank] = worker
            try:
                await self._start_one(worker)
            except BaseException:
                if worker.pid <= 0:
                    del self._workers[spec.local_rank]
                raise
            finally:
                if worker.pid <= 0:
                    for fd in worker.file_fds:
                        os.close(fd)
                    worker.file_fds.clear()
            # One fork per turn of the event loop: starting many workers never stalls it.
            await anyio.lowlevel.checkpoint()

    async def _start_one(self, worker: _Worker) -> None:
        spec = worker.spec
        sinks: dict[int, Sink] = {}
        stdio: dict[int, int | None] = {}
        prefix = spec.console_prefix.encode()
        streams: tuple[tuple[int, str | None, Std, ConsoleName], ...] = (
            (1, spec.stdout_file, Std.OUT, "stdout"),
            (2, spec.stderr_file, Std.ERR, "stderr"),
        )
        keep_fds: set[int] = set()  # log files the agent writes itself (piped streams)
        for fd, path, flag, console in streams:
            to_console = spec.show_on_console and (path is None or bool(spec.tee & flag))
            if path is not None:
                file_fd = _open_log(path, spec.local_rank)
                worker.file_fds.append(file_fd)
            else:
                file_fd = None
            # Like torch, only tee'd lines that reach the console are duplicated.
            copy_fd = None
            copy_path, needles = _duplicate(spec, flag)
            if to_console and spec.tee & flag and copy_path is not None and needles:
                copy_fd = _open_log(copy_path, spec.local_rank)
                worker.file_fds.append(copy_fd)
                keep_fds.add(copy_fd)
            if to_console and (prefix or file_fd is not None or copy_fd is not None):
                stdio[fd] = subprocess.PIPE
                sinks[fd] = Sink(
                    file_fd, console, prefix, copy_fd, tuple(n.encode() for n in needles)
                )
                if file_fd is not None:
                    keep_fds.add(file_fd)
            elif file_fd is not None:
                stdio[fd] = file_fd
            elif to_console:
                stdio[fd] = None
            else:
                stdio[fd] = subprocess.DEVNULL
        if spec.error_file:
            _prepare_error_file(spec.error_file, spec.local_rank)

        env = dict(spec.env)
        pipes: list[OutputPipe] = []
        write_ends: list[int] = []
        try:
            for fd, sink in sinks.items():
                pipe, write_end = OutputPipe.open(sink)
                pipes.append(pipe)
                write_ends.append(write_end)
                stdio[fd] = write_end
            if not self._start_warm(worker, stdio, env):
                self._adopt(worker, _spawn(spec, stdio, env, self._ignored))
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            for pipe in pipes:
                pipe.close()
            raise WorkerStartError(
                f"could not start the worker of local rank {spec.local_rank}"
                f" ({list(spec.args)[:3]!r}...): {type(exc).__name__}: {exc}."
                " Check that the entry point exists and is executable, and the cwd exists."
            ) from exc
        finally:
            for fd in write_ends:  # the child holds its own copies
                os.close(fd)
        # The child also holds its own copies of the log files wired straight to it.
        for fd in [fd for fd in worker.file_fds if fd not in keep_fds]:
            os.close(fd)
            worker.file_fds.remove(fd)
        assert self._tg is not None
        for pipe in pipes:
            worker.pipes.append(pipe)
            self._tg.start_soon(pipe.pump)

    def _start_warm(
        self, worker: _Worker, stdio: dict[int, int | None], env: dict[str, str]
    ) -> bool:
        """Hand the worker to an idle warm interpreter; False means spawn it fresh.

        The worker's stdout/stderr are what a fresh spawn would get: a pipe the
        agent reads, a log file, the agent's own stream, or ``/dev/null``.
        """
        pool = self._warm_pool
        if pool is None:
            return False
        spec = worker.spec
        taken = pool.take(spec.args, env, spec.cwd)
        if taken is None:
            return False
        warm, entry = taken
        send: list[int] = []
        close: list[int] = []
        try:
            for fd in (1, 2):
                target = stdio[fd]
                if target == subprocess.DEVNULL:
                    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                    close.append(null)
                    send.append(null)
                elif target is None:
                    os.fstat(fd)  # a closed console: let a fresh spawn inherit that
                    send.append(fd)
                else:
                    send.append(target)
            cwd = spec.cwd if spec.cwd is not None else os.getcwd()
            learn = pool.learn_path(spec.local_rank)
            notices = warm.activate(
                entry, spec.args, env, os.path.abspath(cwd), send[0], send[1], learn, self._ignored
            )
        except OSError as exc:
            log.debug("warm interpreter %s unusable (%s); fresh spawn", warm.pid, exc)
            pool.discard(warm)
            return False
        finally:
            for fd in close:
                os.close(fd)
        log.debug("local rank %s runs in warm interpreter pid %s", spec.local_rank, warm.pid)
        self.warm_ranks.add(spec.local_rank)
        self._adopt(worker, warm.popen, notices)
        return True

    def _adopt(
        self,
        worker: _Worker,
        popen: subprocess.Popen[bytes],
        notices: socket.socket | None = None,
    ) -> None:
        """Adopt ``popen`` as ``worker`` and start watching for its exit (no polling).

        ``notices``: a warm worker's control socket (its script's end); owned from here.
        """
        worker.popen = popen
        worker.pid = popen.pid
        self.pids[worker.spec.local_rank] = popen.pid
        # Only we reap our children, so the pid cannot be reused before pidfd_open.
        if self.watcher == "pidfd":
            worker.pidfd = open_pidfd(popen.pid)  # None: out of descriptors, use a thread
        assert self._tg is not None
        self._tg.start_soon(self._watch, worker, notices)

    async def _watch(self, worker: _Worker, notices: socket.socket | None) -> None:
        try:
            async with anyio.create_task_group() as tg:
                if notices is not None and self._exit_grace is not None:
                    tg.start_soon(self._bound_exit, worker, notices, self._exit_grace)
                code = await wait_exit(worker.pid, worker.pidfd, self._limiter)
                tg.cancel_scope.cancel()
        finally:
            if notices is not None:
                notices.close()
        if worker.script_status is not None and code == -signal.SIGKILL:
            code = worker.script_status  # killed by _bound_exit: its script's own status
        self._on_exit(worker.spec.local_rank, -1 if code is None else code, reaped=code is None)

    async def _bound_exit(self, worker: _Worker, notices: socket.socket, grace: float) -> None:
        """Once the worker's script ended, give it ``grace`` seconds to exit, then kill it.

        Cancelled by :meth:`_watch` the moment the worker exits. Reports the worker after
        :data:`EXIT_WARN_AFTER` seconds and again when it kills it (SIGKILL to its process
        group); the exit is then counted with the status its script ended with.
        """
        status = await receive_exit_notice(notices)
        if status is None:
            return
        worker.ended_with = status
        rank, pid = worker.spec.local_rank, worker.pid
        warn_after = min(EXIT_WARN_AFTER, grace)
        await anyio.sleep(warn_after)
        if warn_after < grace:
            log.warning(
                "worker local_rank=%s (pid %s) ended its script (status %s) %.0f s ago and has"
                " not exited: it is in the interpreter's shutdown (atexit handlers, threads,"
                " destructors such as a process group's teardown; %s); killing it %g s after"
                " its script ended (--exit-grace)",
                rank,
                pid,
                status,
                warn_after,
                shutdown_report(pid),
                grace,
            )
            await anyio.sleep(grace - warn_after)
        self._kill_finished(
            worker,
            status,
            f"did not exit within {grace:g} s (--exit-grace) after its script ended with"
            f" status {status}; it is stuck in the interpreter's shutdown",
        )

    async def _bound_idle_after_peers(self, worker: _Worker, grace: float) -> None:
        """A worker still running after a local peer exited 0: killed once idle for ``grace``.

        Idle: no thread ran more than :data:`IDLE_THREAD_SHARE` of one CPU
        (``/proc/<pid>/task/*/schedstat``) over a whole ``grace`` window, such as a
        teardown deadlock (threads waiting for the GIL that the main thread holds while
        it joins one of them). A worker with a thread that computes is never killed. Reported after
        :data:`EXIT_WARN_AFTER` seconds; counted as exit status 0 when killed (its peers
        succeeded; its work is done). Ends when the worker exits.
        """
        rank, pid = worker.spec.local_rank, worker.pid
        started = time.monotonic()
        with anyio.move_on_after(min(EXIT_WARN_AFTER, grace)):
            await worker.exited.wait()
            return
        log.warning(
            "worker local_rank=%s (pid %s) still runs %.0f s after a local peer exited 0 (%s);"
            " it is killed once it used almost no CPU for %g s (--exit-grace)",
            rank,
            pid,
            time.monotonic() - started,
            shutdown_report(pid),
            grace,
        )
        while True:
            before = thread_busy_seconds(pid)
            with anyio.move_on_after(grace):
                await worker.exited.wait()
                return
            if worker.ended_with is not None:
                return  # its script ended: _bound_exit decides, with its status
            after = thread_busy_seconds(pid)
            if (
                before is not None
                and after is not None
                and busiest_thread_seconds(before, after) < IDLE_THREAD_SHARE * grace
            ):
                break
        self._kill_finished(
            worker,
            0,
            f"used almost no CPU for {grace:g} s (--exit-grace) while every other local worker"
            " had exited 0: it is stuck (a teardown deadlock, for example in a process"
            " group's destructor)",
        )

    def _kill_finished(self, worker: _Worker, status: int, why: str) -> None:
        """Report and SIGKILL a worker whose work is done; its exit counts as ``status``."""
        log.error(
            "worker local_rank=%s (pid %s) %s (%s). Killed with SIGKILL; counted as exit"
            " status %s.",
            worker.spec.local_rank,
            worker.pid,
            why,
            shutdown_report(worker.pid),
            status,
        )
        worker.script_status = status
        self._killpg(worker, signal.SIGKILL)

    async def _drain(self) -> None:
        """Wait (bounded) for the pipes of exited workers to reach end of stream."""
        dead = [w for r, w in self._workers.items() if r in self.exits]
        with anyio.move_on_after(_DRAIN_TIMEOUT):
            for worker in dead:
                await worker.drained()
            await wait_consoles_written()

    def _release(self) -> None:
        """Reap; close pidfds, pipes and log files (after the watching tasks ended)."""
        for rank, worker in self._workers.items():
            for pipe in worker.pipes:
                pipe.close()
            if worker.pidfd is not None:
                os.close(worker.pidfd)
                worker.pidfd = None
            if worker.popen is not None and not worker.reaped:
                if rank in self.exits:
                    with contextlib.suppress(ChildProcessError):
                        worker.popen.wait()
                else:
                    _abandoned.append(worker.popen)
                worker.reaped = True
            for fd in worker.file_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            worker.file_fds.clear()
        self._closed = True
        self._wake()


def _spawn(
    spec: ProcessSpec,
    stdio: dict[int, int | None],
    env: dict[str, str],
    ignored: Collection[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``spec`` fresh: own session, death signal, ``ignored`` signals ignored; one
    fork (a vfork in wrapper mode)."""
    argv, preexec = wrap_argv(spec.args, env, spec.cwd, ignored)
    return subprocess.Popen(
        argv,
        stdin=None,
        stdout=stdio[1],
        stderr=stdio[2],
        env=env,
        cwd=spec.cwd,
        start_new_session=True,
        preexec_fn=preexec,
    )


def _duplicate(spec: ProcessSpec, flag: Std) -> tuple[str | None, tuple[str, ...]]:
    if flag == Std.OUT:
        return spec.filtered_stdout_file, spec.duplicate_stdout_filters
    return spec.filtered_stderr_file, spec.duplicate_stderr_filters


def _open_log(path: str, local_rank: int) -> int:
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise WorkerStartError(
            f"cannot open log file {path!r} for local rank {local_rank}: {exc}."
            " Choose a writable --log-dir."
        ) from exc


def _prepare_error_file(path: str, local_rank: int) -> None:
    # A stale error file would be read as this attempt's root cause.
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    except OSError as exc:
        raise WorkerStartError(
            f"cannot prepare error file {path!r} for local rank {local_rank}: {exc}"
        ) from exc


def _check_specs(specs: Sequence[ProcessSpec]) -> None:
    if not specs:
        raise ValueError("open_worker_processes needs at least one ProcessSpec")
    ranks = [s.local_rank for s in specs]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ProcessSpec local ranks must be unique, got {ranks}")
    for spec in specs:
        if isinstance(spec.args, str | bytes) or not spec.args:
            raise ValueError(
                f"ProcessSpec(local_rank={spec.local_rank}).args must be a non-empty argv"
                f" sequence such as [sys.executable, '-u', 'train.py'], got {spec.args!r}"
            )
        bad = [a for a in spec.args if not isinstance(a, str)]
        if bad:
            raise ValueError(
                f"ProcessSpec(local_rank={spec.local_rank}).args must all be str; convert"
                f" {bad!r} with str()"
            )
        for name in ("duplicate_stdout_filters", "duplicate_stderr_filters"):
            needles = getattr(spec, name)
            if isinstance(needles, str | bytes) or not all(isinstance(n, str) for n in needles):
                raise ValueError(
                    f"ProcessSpec(local_rank={spec.local_rank}).{name} must be a sequence of"
                    f" str such as ('loss',), got {needles!r}"
                )


@contextlib.asynccontextmanager
async def open_worker_processes(
    specs: Sequence[ProcessSpec],
    *,
    shutdown_timeout: float = 30.0,
    kill_timeout: float = DEFAULT_KILL_TIMEOUT,
    warm_pool: WarmPool | None = None,
    exit_grace: float | None = DEFAULT_EXIT_GRACE,
    ignored_signals: Collection[int] = (),
) -> AsyncIterator[WorkerProcesses]:
    """Start one process per spec; on exit of the block, stop and reap them all.

    Each worker gets its own session and process group and (Linux) the
    parent-death signal SIGKILL. On leaving the block, normally, by an error
    or by **cancellation**, surviving workers get SIGTERM, then SIGKILL after
    ``shutdown_timeout`` seconds (one deadline for all), the cleanup runs
    shielded from cancellation, every process is reaped (bounded by
    ``kill_timeout`` after SIGKILL), every pipe and log file descriptor is
    closed, and the original exception or cancellation propagates.

    With a ``warm_pool`` (:func:`open_warm_pool`), a Python worker it can run
    is handed to a pre-started interpreter instead of a fresh spawn (same pid
    semantics, same output wiring); anything else is spawned as usual. A warm
    worker whose script ended (returned, ``sys.exit``, an uncaught exception) and
    that has not exited ``exit_grace`` seconds later (stuck in the interpreter's
    shutdown) is reported, killed, and counted with its script's exit status
    (:mod:`aelastic.workers._exit_grace`); so is, counted as 0, any worker that used
    almost no CPU over a whole ``exit_grace`` window after another worker exited 0 (a
    teardown deadlock). None or ``<= 0``: no bound.

    ``ignored_signals``: signals every worker starts with ignored (``SIG_IGN``, kept
    across exec; a script that installs its own handler still gets them), fresh or
    warm, on top of those the agent ignores itself (e.g. SIGUSR1 while the agent traps
    it as a scheduler's preemption notice, which the scheduler sends the workers too).

    Raises :class:`WorkerStartError` if a process cannot be started (the ones
    already started are stopped first) and :class:`ValueError` for bad specs.
    Runs on every anyio backend (asyncio, uvloop, trio). The exit watchers and
    pipe readers are tasks of a task group this block owns; an error of the
    block's body propagates as itself, never wrapped in an exception group.
    """
    _check_specs(specs)
    processes = WorkerProcesses(specs, kill_timeout, warm_pool, exit_grace, ignored_signals)
    try:
        async with background_tasks() as processes._tg:
            try:
                await processes._start_all(specs)
                yield processes
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await processes.stop(signal.SIGTERM, shutdown_timeout)
                    finally:
                        await processes._drain()
    finally:
        processes._release()  # after the watchers and readers ended: nothing uses the fds
