"""Worker processes: start, notice exits the moment they happen, stop, reap.

Each worker runs in its own session (so its process group id is its pid) and,
on Linux, with ``PR_SET_PDEATHSIG=SIGKILL`` so it dies with the agent even when
the agent is SIGKILLed. Exits arrive from a pidfd registered with the event
loop (Linux >= 5.3; elsewhere the loop's own child watcher): no polling.
Output that must be prefixed, tee'd or filtered flows through a pipe into the
agent, which writes whole lines to the console and raw bytes to the log file;
everything else is wired straight to the file or the inherited console.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import IO, cast

import anyio
import sniffio

from ..errors import ProcessFailure
from ._exceptions import NoMoreExitsError, WorkerProcessError, WorkerStartError
from ._output import ConsoleName, PipeProtocol, Sink
from ._pdeathsig import wrap_argv
from ._procfs import process_state
from ._spec import ProcessExit, ProcessSpec
from ._std import Std
from ._warm import WarmPool
from ._watch import _watcher

__all__ = ("WorkerProcesses", "open_worker_processes")

log = logging.getLogger(__name__)

#: How long to wait for processes to die after SIGKILL before giving up on them.
DEFAULT_KILL_TIMEOUT = 5.0
#: How long to wait, once every process is dead, for their output pipes to drain.
_DRAIN_TIMEOUT = 2.0
#: Workers that survived SIGKILL: kept referenced so nothing warns about them later.
_abandoned: list[subprocess.Popen[bytes]] = []


class _WorkerProtocol(asyncio.SubprocessProtocol):
    """The ``asyncio`` watcher: the loop's child watcher reports the exit (and reaps)."""

    def __init__(self, owner: WorkerProcesses, local_rank: int, sinks: dict[int, Sink]) -> None:
        self._owner = owner
        self._local_rank = local_rank
        self._sinks = sinks
        self.drained = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transport quacks like asyncio.SubprocessTransport without subclassing it.
        self._owner._on_transport(self._local_rank, cast(asyncio.SubprocessTransport, transport))

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        sink = self._sinks.get(fd)
        if sink is not None:
            sink.feed(data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        sink = self._sinks.get(fd)
        if sink is not None:
            sink.finish()

    def process_exited(self) -> None:
        transport = self._owner._workers[self._local_rank].transport
        code = None if transport is None else transport.get_returncode()
        self._owner._on_exit(self._local_rank, -1 if code is None else code, reaped=True)

    def connection_lost(self, exc: Exception | None) -> None:
        # Called once the process exited and every pipe is closed.
        for sink in self._sinks.values():
            sink.finish()
        self.drained.set()


class _Worker:
    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.pid = -1
        self.exited = anyio.Event()
        self.file_fds: list[int] = []
        # "asyncio" watcher
        self.transport: asyncio.SubprocessTransport | None = None
        self.protocol: _WorkerProtocol | None = None
        # "pidfd" watcher
        self.popen: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.pipes: list[tuple[asyncio.BaseTransport | None, PipeProtocol, IO[bytes]]] = []
        # True once the pid was reaped: from then on it may belong to someone else.
        self.reaped = False

    async def drained(self) -> None:
        if self.protocol is not None:
            await self.protocol.drained.wait()
        for _, protocol, _ in self.pipes:
            await protocol.closed.wait()


class WorkerProcesses:
    """The live worker processes of one start, from :func:`open_worker_processes`.

    ``pids`` maps local rank to pid; ``exits`` holds every exit noticed so far
    (a worker is alive while its rank is absent). ``unreaped`` lists the
    processes that survived SIGKILL during :meth:`stop` (Linux D-state).

    With the ``pidfd`` watcher (Linux >= 5.3) an exited worker stays a zombie
    until the block ends, so its pid, and thus its process group id, cannot be
    reused meanwhile: signalling the group of an exited worker reaches exactly
    the children it left behind, never a stranger.
    """

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        kill_timeout: float,
        warm_pool: WarmPool | None = None,
    ) -> None:
        self.specs: dict[int, ProcessSpec] = {s.local_rank: s for s in specs}
        self.pids: dict[int, int] = {}
        self.exits: dict[int, ProcessExit] = {}
        self.unreaped: dict[int, int] = {}
        self.watcher = _watcher()
        self._kill_timeout = kill_timeout
        self._workers: dict[int, _Worker] = {}
        self._pending: collections.deque[ProcessExit] = collections.deque()
        self._changed = anyio.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warm_pool = warm_pool
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

        Non-blocking (one ``waitid(WNOHANG)`` per live worker); call it right before
        :meth:`stop` to tell workers that ended on their own from the ones the signal
        will end. Only the ``pidfd`` watcher can look ahead; with the ``asyncio``
        watcher this does nothing.
        """
        for rank, worker in self._workers.items():
            if rank not in self.exits and worker.pidfd is not None:
                self._on_pidfd_readable(rank)

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

    def _on_transport(self, local_rank: int, transport: asyncio.SubprocessTransport) -> None:
        worker = self._workers[local_rank]
        worker.transport = transport
        worker.pid = transport.get_pid()
        self.pids[local_rank] = worker.pid

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

    def _on_pidfd_readable(self, local_rank: int) -> None:
        worker = self._workers[local_rank]
        assert worker.pidfd is not None and self._loop is not None
        reaped = False
        try:
            # WNOWAIT: read the status but leave the zombie, so the pid stays ours.
            info = os.waitid(os.P_PIDFD, worker.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind our back (SIGCHLD ignored, waitpid(-1))
            info, reaped = None, True
        else:
            if info is None:
                return
        self._loop.remove_reader(worker.pidfd)
        if info is None:
            code = -1
        elif info.si_code == os.CLD_EXITED:
            code = info.si_status
        else:  # CLD_KILLED, CLD_DUMPED
            code = -info.si_status
        self._on_exit(local_rank, code, reaped=reaped)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _start_all(self, specs: Sequence[ProcessSpec]) -> None:
        self._loop = asyncio.get_running_loop()
        for spec in specs:
            worker = _Worker(spec)
            self._workers[spec.local_rank] = worker
            try:
                await self._start_one(self._loop, worker)
            except BaseException:
                if worker.pid <= 0:
                    del self._workers[spec.local_rank]
                raise
            finally:
                if worker.pid <= 0:
                    for fd in worker.file_fds:
                        os.close(fd)
                    worker.file_fds.clear()

    async def _start_one(self, loop: asyncio.AbstractEventLoop, worker: _Worker) -> None:
        spec = worker.spec
        sinks: dict[int, Sink] = {}
        stdio: dict[int, int | None] = {}
        prefix = spec.console_prefix.encode()
        streams: tuple[tuple[int, str | None, Std, ConsoleName], ...] = (
            (1, spec.stdout_file, Std.OUT, "stdout"),
            (2, spec.stderr_file, Std.ERR, "stderr"),
        )
        copy_fds: set[int] = set()
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
                copy_fds.add(copy_fd)
            if to_console and (prefix or file_fd is not None or copy_fd is not None):
                stdio[fd] = subprocess.PIPE
                sinks[fd] = Sink(
                    file_fd, console, prefix, copy_fd, tuple(n.encode() for n in needles)
                )
            elif file_fd is not None:
                stdio[fd] = file_fd
            elif to_console:
                stdio[fd] = None
            else:
                stdio[fd] = subprocess.DEVNULL
        if spec.error_file:
            _prepare_error_file(spec.error_file, spec.local_rank)

        env = dict(spec.env)
        reads: dict[int, IO[bytes]] = {}
        try:
            if not self._start_warm(loop, worker, stdio, env, reads):
                argv, preexec = wrap_argv(spec.args, env, spec.cwd)
                if self.watcher == "pidfd":
                    self._spawn_pidfd(loop, worker, argv, preexec, stdio, env)
                else:
                    await self._spawn_asyncio(loop, worker, argv, preexec, stdio, env, sinks)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise WorkerStartError(
                f"could not start the worker of local rank {spec.local_rank}"
                f" ({list(spec.args)[:3]!r}...): {type(exc).__name__}: {exc}."
                " Check that the entry point exists and is executable, and the cwd exists."
            ) from exc
        # The child holds its own copies of the file descriptors wired straight to it.
        piped = {s.file_fd for s in sinks.values()} | copy_fds
        for fd in [fd for fd in worker.file_fds if fd not in piped]:
            os.close(fd)
            worker.file_fds.remove(fd)
        if worker.popen is not None:
            for fd, sink in sinks.items():
                pipe = reads.get(fd) or (worker.popen.stdout if fd == 1 else worker.popen.stderr)
                assert pipe is not None
                protocol = PipeProtocol(sink)
                worker.pipes.append((None, protocol, pipe))
                transport, _ = await loop.connect_read_pipe(
                    functools.partial(_same, protocol), pipe
                )
                worker.pipes[-1] = (transport, protocol, pipe)

    def _start_warm(
        self,
        loop: asyncio.AbstractEventLoop,
        worker: _Worker,
        stdio: dict[int, int | None],
        env: dict[str, str],
        reads: dict[int, IO[bytes]],
    ) -> bool:
        """Hand the worker to an idle warm interpreter; False means spawn it fresh.

        The worker's stdout/stderr are what a fresh spawn would get: a pipe the
        agent reads (its read end lands in ``reads``), a log file, the agent's
        own stream, or ``/dev/null``.
        """
        pool = self._warm_pool
        if pool is None or self.watcher != "pidfd":
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
                if target == subprocess.PIPE:
                    r, w = os.pipe2(os.O_CLOEXEC)
                    reads[fd] = os.fdopen(r, "rb", buffering=0)
                    close.append(w)
                    send.append(w)
                elif target == subprocess.DEVNULL:
                    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                    close.append(null)
                    send.append(null)
                elif target is None:
                    os.fstat(fd)  # a closed console: let a fresh spawn inherit that
                    send.append(fd)
                else:
                    send.append(target)
            cwd = spec.cwd if spec.cwd is not None else os.getcwd()
            warm.activate(entry, spec.args, env, os.path.abspath(cwd), send[0], send[1])
        except OSError as exc:
            log.debug("warm interpreter %s unusable (%s); fresh spawn", warm.pid, exc)
            pool.discard(warm)
            for pipe in reads.values():
                pipe.close()
            reads.clear()
            return False
        finally:
            for fd in close:
                os.close(fd)
        log.debug("local rank %s runs in warm interpreter pid %s", spec.local_rank, warm.pid)
        self.warm_ranks.add(spec.local_rank)
        self._watch_pidfd(loop, worker, warm.popen)
        return True

    def _spawn_pidfd(
        self,
        loop: asyncio.AbstractEventLoop,
        worker: _Worker,
        argv: list[str],
        preexec: Callable[[], None] | None,
        stdio: dict[int, int | None],
        env: dict[str, str],
    ) -> None:
        popen = subprocess.Popen(
            argv,
            stdin=None,
            stdout=stdio[1],
            stderr=stdio[2],
            env=env,
            cwd=worker.spec.cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )
        self._watch_pidfd(loop, worker, popen)

    def _watch_pidfd(
        self,
        loop: asyncio.AbstractEventLoop,
        worker: _Worker,
        popen: subprocess.Popen[bytes],
    ) -> None:
        """Adopt ``popen`` as ``worker`` and have the loop tell us the moment it exits."""
        worker.popen = popen
        worker.pid = popen.pid
        self.pids[worker.spec.local_rank] = popen.pid
        # Only we reap our children, so the pid cannot be reused before pidfd_open.
        worker.pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(worker.pidfd, self._on_pidfd_readable, worker.spec.local_rank)

    async def _spawn_asyncio(
        self,
        loop: asyncio.AbstractEventLoop,
        worker: _Worker,
        argv: list[str],
        preexec: Callable[[], None] | None,
        stdio: dict[int, int | None],
        env: dict[str, str],
        sinks: dict[int, Sink],
    ) -> None:
        protocol = _WorkerProtocol(self, worker.spec.local_rank, sinks)
        worker.protocol = protocol
        transport, _ = await loop.subprocess_exec(
            lambda: protocol,
            *argv,
            stdin=None,
            stdout=stdio[1],
            stderr=stdio[2],
            env=env,
            cwd=worker.spec.cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )
        if worker.transport is None:  # a loop that skipped connection_made
            self._on_transport(worker.spec.local_rank, transport)

    async def _close(self) -> None:
        """Wait (bounded) for pipes to drain; reap; close pidfds, pipes and log files."""
        dead = [w for r, w in self._workers.items() if r in self.exits]
        with anyio.move_on_after(_DRAIN_TIMEOUT):
            for worker in dead:
                await worker.drained()
        for rank, worker in self._workers.items():
            if worker.transport is not None:
                worker.transport.close()
            for transport, _, pipe in worker.pipes:
                if transport is not None:
                    transport.close()
                pipe.close()
            if worker.pidfd is not None:
                if rank not in self.exits and self._loop is not None:
                    self._loop.remove_reader(worker.pidfd)
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


def _duplicate(spec: ProcessSpec, flag: Std) -> tuple[str | None, tuple[str, ...]]:
    if flag == Std.OUT:
        return spec.filtered_stdout_file, spec.duplicate_stdout_filters
    return spec.filtered_stderr_file, spec.duplicate_stderr_filters


def _same(protocol: PipeProtocol) -> PipeProtocol:
    return protocol


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
    semantics, same output wiring); anything else is spawned as usual.

    Raises :class:`WorkerStartError` if a process cannot be started (the ones
    already started are stopped first) and :class:`ValueError` for bad specs.
    Needs the asyncio backend of anyio (plain asyncio or uvloop).
    """
    _check_specs(specs)
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = "none"
    if library != "asyncio":
        raise WorkerProcessError(
            f"open_worker_processes runs on anyio's asyncio backend (asyncio or uvloop), not"
            f" {library!r}; run the agent with anyio.run(..., backend='asyncio')"
        )
    processes = WorkerProcesses(specs, kill_timeout, warm_pool)
    try:
        await processes._start_all(specs)
        yield processes
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await processes.stop(signal.SIGTERM, shutdown_timeout)
            finally:
                await processes._close()
