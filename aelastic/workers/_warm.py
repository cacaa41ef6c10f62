"""Pre-started ("warm") worker interpreters: the interpreter start-up off the restart path.

A :class:`WarmPool` keeps up to ``size`` Python interpreters started and idle,
each spawned exactly like a worker (own session and process group, the
parent-death signal through the same wrapper) running ``_warm_boot.py``, which
blocks on a control socket. :func:`open_worker_processes` activates one instead
of spawning a fresh interpreter: it sends the worker's stdout/stderr
descriptors, environment, argv and cwd, and the idle interpreter becomes the
worker, keeping its pid (so signals, stop and pidfd exit detection are
unchanged). After each activation the pool starts replacements in the
background, ``replenish_delay`` seconds later (the activated workers get the
CPU first; a short job never pays for them), so the next restart finds them
ready.

Used only when the worker's argv is ``[python, <flags with -u>, script, ...]``
or ``[python, <flags with -u>, -m, module, ...]`` with the pool's interpreter
and flags, and no variable the interpreter reads at start-up (``PYTHON*``,
``LC_*``, ``LANG``, ``HOME``) differs between the pool's and the worker's
environment; anything else (callables, ``--no-python`` binaries, another
interpreter, zip apps, a missing script or cwd) silently gets a fresh spawn.
The one visible difference: start-up code (``sitecustomize``, ``.pth`` files)
runs before the worker's environment exists, and ``/proc/<pid>/cmdline`` and
``/proc/<pid>/environ`` show the bootstrap's. ``AELASTIC_WARM_WORKERS=0``
turns the pool off. A launcher can start the first set even earlier, before
its own imports, with :func:`prestart_warm_workers`; the pool adopts them.

With ``preload`` (``--preload``) the interpreters started after the first hand-off
also import modules while idle (:mod:`aelastic.workers._preload`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from .._dataclass import dataclass
from ._dispositions import spawn_signals
from ._pdeathsig import wrap_argv
from ._preload import PreloadPlan, sweep_preload_directories

if TYPE_CHECKING:
    import anyio
    import anyio.abc

__all__ = (
    "WARM_WORKERS_ENV",
    "PythonEntry",
    "WarmPool",
    "open_warm_pool",
    "parse_python_argv",
    "prestart_warm_workers",
    "warm_workers_enabled",
)

log = logging.getLogger("aelastic.workers")

#: ``0`` (or ``false``/``no``/``off``) turns warm worker interpreters off.
WARM_WORKERS_ENV = "AELASTIC_WARM_WORKERS"
#: Seconds between an activation and the start of its replacements.
DEFAULT_REPLENISH_DELAY = 0.25
_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_warm_boot.py")
_MAGIC = b"aelastic-warm-3"
_NO_ARG_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-b", "-bb", "-s", "-S", "-q", "-E", "-R"})
_STARTUP_PREFIXES = ("PYTHON", "LC_")
_STARTUP_NAMES = frozenset({"LANG", "HOME"})
_KILL_TIMEOUT = 5.0


def warm_workers_enabled() -> bool:
    """False when ``AELASTIC_WARM_WORKERS`` is ``0``/``false``/``no``/``off``."""
    value = os.environ.get(WARM_WORKERS_ENV, "").strip().lower()
    return value not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class PythonEntry:
    """A worker argv that a warm interpreter can run: ``python <flags> script|-m module``."""

    executable: str
    flags: tuple[str, ...]
    kind: str  # "script" or "module"
    target: str
    args: tuple[str, ...]

    @property
    def prefix(self) -> tuple[str, ...]:
        """``(executable, *flags)``: what the interpreter was started with."""
        return (self.executable, *self.flags)

    @property
    def sys_argv(self) -> list[str]:
        """``sys.argv`` when the target starts (runpy replaces ``-m`` with the module's path)."""
        return [self.target, *self.args] if self.kind == "script" else ["-m", *self.args]


def _same_python(executable: str) -> bool:
    if not os.path.isabs(executable):
        return False
    try:
        return os.path.samefile(executable, sys.executable)
    except OSError:
        return False


def parse_python_argv(argv: Sequence[str]) -> PythonEntry | None:
    """The :class:`PythonEntry` of ``argv``, or None when a warm interpreter cannot run it.

    Accepts this interpreter (an absolute path to ``sys.executable``), options
    among ``-u -B -O -OO -b -bb -s -S -q -E -R -W<arg> -X<arg>`` including
    ``-u``, then a script or ``-m module``.
    """
    if not argv or not _same_python(argv[0]):
        return None
    flags: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in _NO_ARG_FLAGS:
            flags.append(arg)
        elif arg in ("-W", "-X") and i + 1 < len(argv):
            flags += [arg, argv[i + 1]]
            i += 1
        elif arg[:2] in ("-W", "-X") and len(arg) > 2:
            flags.append(arg)
        elif arg == "-m" and i + 1 < len(argv) and argv[i + 1]:
            entry = PythonEntry(argv[0], tuple(flags), "module", argv[i + 1], tuple(argv[i + 2 :]))
            return entry if "-u" in flags else None
        elif arg and not arg.startswith("-"):
            entry = PythonEntry(argv[0], tuple(flags), "script", arg, tuple(argv[i + 1 :]))
            return entry if "-u" in flags else None
        else:
            return None
        i += 1
    return None


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


def _plain_script(path: str) -> bool:
    """True for a regular source file (not a directory, zip app or bytecode file)."""
    if path.endswith((".pyc", ".pyo", ".pyz", ".zip")):
        return False
    try:
        with open(path, "rb") as f:
            if not os.path.isfile(path) or f.read(2) == b"PK":
                return False
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 4096))
            return b"PK\x05\x06" not in f.read()
    except OSError:
        return False


class WarmProcess:
    """One idle warm interpreter: its ``Popen`` and the agent's end of the control socket."""

    def __init__(self, popen: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.popen = popen
        self.control = control
        #: The environment it preloads modules in (None: no preload).
        self.preloaded_env: dict[str, str] | None = None
        #: That environment is the agent's prediction (before the first hand-off).
        self.predicted = False

    def preload(self, message: bytes, env: dict[str, str]) -> bool:
        """Send a preload message (before the activation); False if it does not fit at once.

        Never blocks: a fresh socket's buffer takes a few kilobytes; a larger
        message is not sent (no preload for this interpreter).
        """
        data = len(message).to_bytes(8, "big") + message
        if len(data) > self.control.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2:
            return False
        try:
            sent = self.control.send(data, socket.MSG_DONTWAIT)
        except OSError:
            return False
        if sent != len(data):  # cannot happen below half the buffer; make it fail loudly
            self.control.close()
            return False
        self.preloaded_env = env
        return True

    @property
    def pid(self) -> int:
        return self.popen.pid

    def activate(
        self,
        entry: PythonEntry,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdout_fd: int,
        stderr_fd: int,
        learn: str = "",
        ignored: Collection[int] = (),
    ) -> socket.socket:
        """Turn the interpreter into the worker; raises OSError when it cannot be reached.

        ``learn``: a file where the worker records the modules it imports (``--preload
        auto``); empty for none.

        The worker starts with the signal dispositions and mask a fresh spawn
        from this thread would have now (:func:`spawn_signals`), whatever they
        were when the interpreter was pre-started, with ``ignored`` ignored too
        (as a fresh spawn given them would start). Returns the control socket,
        on which the worker writes ``exit <status>`` when its script ends (see
        :mod:`aelastic.workers._exit_grace`): the caller owns it and the process
        after. On error the socket is closed.
        """
        sys_argv = entry.sys_argv
        fields = [_MAGIC, os.fsencode(cwd), entry.kind.encode(), os.fsencode(entry.target)]
        fields.append(os.fsencode(learn))
        fields += spawn_signals(ignored).encode()
        for items in (list(argv), sys_argv):
            fields.append(str(len(items)).encode())
            fields += [os.fsencode(a) for a in items]
        fields += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
        body = b"\0".join(fields)
        message = len(body).to_bytes(8, "big") + body
        try:
            self.control.settimeout(_KILL_TIMEOUT)
            # One sendmsg wakes the worker once with everything (a few KiB, far below the
            # socket buffer); the rest, if any, follows.
            sent = socket.send_fds(self.control, [message], [stdout_fd, stderr_fd])
            if sent < len(message):
                self.control.sendall(message[sent:])
        except BaseException:
            self.control.close()
            raise
        self.control.setblocking(False)
        return self.control


class WarmPool:
    """Idle warm interpreters for one Python entry point; see :func:`open_warm_pool`."""

    def __init__(
        self,
        prefix: Sequence[str],
        size: int,
        replenish_delay: float,
        preload: PreloadPlan | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a warm pool needs size >= 1, got {size}")
        self.prefix = tuple(prefix)
        self.preload = preload
        self.size = size
        self.replenish_delay = replenish_delay
        self.start_env = dict(os.environ)
        self._idle: list[WarmProcess] = []
        self._spares: list[WarmProcess] = []  # taken but not yet handed over
        self._closed = False
        self._broken = False
        #: Extra interpreters until the first take (preload before the first hand-off:
        #: the next restart's interpreters start importing with the first workers).
        self.first_spares = 0
        self._filled: anyio.Event | None = None  # made by a waiter: no event loop needed before
        self._wanted: anyio.Event | None = None  # set by take(); made in the event loop

    async def wait_ready(self) -> None:
        """Wait until ``size`` interpreters are idle (started; maybe still initialising).

        Returns at once for a closed or broken pool. Cancellation is safe.
        """
        while not (self._closed or self._broken or len(self._idle) >= self.size):
            if self._filled is None:
                import anyio  # not at the top: the launcher pre-starts before importing anyio

                self._filled = anyio.Event()
            await self._filled.wait()

    @property
    def idle_pids(self) -> list[int]:
        """Pids of the idle warm interpreters (for tests and logs)."""
        return [w.pid for w in self._idle]

    def idle_rss(self) -> int:
        """Resident memory of the idle interpreters, in bytes (``/proc/<pid>/statm``).

        A few tiny procfs reads: cheap enough for a status probe on the event loop.
        """
        total = 0
        page = os.sysconf("SC_PAGE_SIZE")
        for pid in self.idle_pids:
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    total += int(f.read().split()[1]) * page
            except (OSError, IndexError, ValueError):
                continue
        return total

    def learn_path(self, local_rank: int) -> str:
        """Where the worker of ``local_rank`` records its imports ("" when nothing learns)."""
        return "" if self.preload is None else self.preload.learn_path(local_rank)

    def take(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> tuple[WarmProcess, PythonEntry] | None:
        """An idle interpreter fit to run ``argv`` with ``env`` in ``cwd``, or None.

        The caller must :meth:`WarmProcess.activate` it (or :meth:`discard` it).
        Schedules replacements.
        """
        if self._closed or self._broken:
            return None
        entry = parse_python_argv(argv)
        if entry is None or entry.prefix != self.prefix:
            log.debug("warm pool: %r is not %r <script>; fresh spawn", list(argv)[:3], self.prefix)
            return None
        if _startup_env(env) != _startup_env(self.start_env):
            log.debug(
                "warm pool: the worker's PYTHON*/LC_*/LANG/HOME variables differ from the"
                " pool's; fresh spawn"
            )
            return None
        if cwd is not None and not os.path.isdir(cwd):
            return None
        if entry.kind == "script" and not _plain_script(
            entry.target if cwd is None else os.path.join(cwd, entry.target)
        ):
            log.debug("warm pool: %r is not a plain source file; fresh spawn", entry.target)
            return None
        if self.preload is not None:
            where = os.path.abspath(cwd or os.getcwd())
            self.preload.observe(entry.kind, entry.target, entry.sys_argv, env, where)
        while self._idle:
            warm = self._idle.pop(0)
            if warm.popen.poll() is not None:
                log.debug(
                    "warm pool: idle interpreter %s exited (%s)", warm.pid, warm.popen.returncode
                )
                warm.control.close()
            elif self.preload is not None and not (
                self.preload.fits_prediction(warm.preloaded_env, env)
                if warm.predicted
                else self.preload.fits(warm.preloaded_env, env)
            ):
                log.debug("warm pool: %s preloaded in another environment; killed", warm.pid)
                self.discard(warm)
            else:
                self.first_spares = 0
                self._schedule_replenish()
                return warm, entry
        self.first_spares = 0
        self._schedule_replenish()
        return None

    def hurry(self) -> int:
        """Give the idle interpreters' preload threads this process's priority back.

        For a restart (a worker failed): the running workers they yielded to are being
        stopped, and the next workers wait on these imports. Lowering a nice value
        needs ``CAP_SYS_NICE`` (root outside a container's default capabilities);
        without it nothing changes. Returns how many threads were set. A few
        ``/proc`` reads and ``setpriority`` calls; never raises.
        """
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        raised = 0
        for warm in self._idle:
            if warm.preloaded_env is None:
                continue
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{warm.pid}/task")]
            except (OSError, ValueError):
                continue
            for tid in tids:
                if tid == warm.pid:
                    continue  # the main thread, the future worker, was never lowered
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, mine)
                except OSError:
                    continue
                raised += 1
        return raised

    def discard(self, warm: WarmProcess) -> None:
        """Kill a taken interpreter that could not be activated; reaped at close."""
        warm.control.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(warm.pid, signal.SIGKILL)
        self._spares.append(warm)

    def _missing(self) -> bool:
        wanted = self.size + self.first_spares
        return not self._closed and not self._broken and len(self._idle) < wanted

    def fill(self) -> None:
        """Start interpreters until ``size`` are idle, all at once (a fork each).

        For a launcher before its event loop runs (:func:`prestart_warm_workers`);
        inside a loop the pool refills itself, one fork per turn of the loop.
        """
        while self._missing():
            self._spawn_one()
        self._notify_filled()

    async def _fill_stepwise(self) -> None:
        """Start interpreters until ``size`` are idle, one fork per turn of the event loop."""
        import anyio.lowlevel

        while self._missing():
            self._spawn_one()
            await anyio.lowlevel.checkpoint()
        self._notify_filled()

    def _spawn_one(self) -> None:
        try:
            self._idle.append(self._spawn())
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            self._broken = True
            log.warning("warm pool: cannot pre-start a worker interpreter (%s); off", exc)

    def _notify_filled(self) -> None:
        if self._filled is not None:
            self._filled.set()
            self._filled = None

    def _schedule_replenish(self) -> None:
        if self._wanted is not None:
            self._wanted.set()

    async def _refill_forever(self) -> None:
        """After each take, wait ``replenish_delay`` (the workers get the CPU first), refill.

        Never raises (a pool that cannot spawn turns itself off); runs until cancelled.
        """
        import anyio

        while True:
            assert self._wanted is not None
            await self._wanted.wait()
            self._wanted = anyio.Event()  # a take from now on asks for another pass
            await anyio.sleep(self.replenish_delay)
            await self._fill_stepwise()

    def _spawn(self) -> WarmProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = dict(self.start_env)
            argv, preexec = wrap_argv([*self.prefix, _BOOT, str(theirs.fileno())], env, None)
            popen = subprocess.Popen(
                argv,
                stdin=None,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        log.debug("warm pool: pre-started interpreter pid %s", popen.pid)
        warm = WarmProcess(popen, ours)
        self._send_preload(warm)
        return warm

    def _send_preload(self, warm: WarmProcess) -> None:
        """The preload message, if the plan knows the workers' world (never blocks).

        Before the first take, the first ``size`` interpreters (the first workers)
        import at their own priority; every other one at nice 19.
        """
        first = self.first_spares > 0 and len(self._idle) < self.size
        message = None if self.preload is None else self.preload.message(lowest=not first)
        if message is not None and warm.preload(*message):
            warm.predicted = self.preload is not None and self.preload.predicted

    async def aclose(self) -> None:
        """Kill and reap every idle interpreter; bounded, shielded from cancellation."""
        self._closed = True
        if self._filled is not None:
            self._filled.set()
        victims, self._idle, self._spares = self._idle + self._spares, [], []
        for warm in victims:
            warm.control.close()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(warm.pid, signal.SIGKILL)
        import anyio

        with anyio.CancelScope(shield=True):
            for warm in victims:
                await _reap(warm.popen)


async def _reap(popen: subprocess.Popen[bytes]) -> None:
    import anyio.to_thread

    if popen.poll() is not None:
        return
    try:
        pidfd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        with anyio.move_on_after(_KILL_TIMEOUT):
            if pidfd is not None:
                await anyio.wait_readable(pidfd)
            else:
                await anyio.to_thread.run_sync(_wait_quietly, popen, abandon_on_cancel=True)
        if popen.poll() is None:
            log.error("warm pool: interpreter %s survived SIGKILL; abandoning it", popen.pid)
    finally:
        if pidfd is not None:
            os.close(pidfd)


@dataclass
class _Prestarted:
    prefix: tuple[str, ...]
    start_env: dict[str, str]
    procs: list[WarmProcess]


_prestarted: _Prestarted | None = None


def prestart_warm_workers(argv: Sequence[str], size: int) -> bool:
    """Start ``size`` warm interpreters for ``argv`` now, for the next pool to adopt.

    For a launcher's entry point: call it as early as possible (right after
    parsing the command line and setting the workers' environment, before the
    heavy imports), so the workers' interpreters start up while the launcher is
    still importing; the agent's :func:`open_warm_pool` then adopts them if its
    interpreter and flags match and no start-up variable changed meanwhile.
    Synchronous (one fork each), never raises (False when warm workers are off,
    ``argv`` cannot run warm, or spawning fails). Unadopted interpreters die
    with this process (end of their control socket, and the parent-death
    signal). Call it from the thread that will run the event loop.
    """
    global _prestarted
    if _prestarted is not None or size < 1 or not warm_workers_enabled():
        return False
    entry = parse_python_argv(argv)
    if entry is None:
        return False
    holder = WarmPool(entry.prefix, size, DEFAULT_REPLENISH_DELAY)
    holder.fill()
    if not holder._idle:
        return False
    _prestarted = _Prestarted(entry.prefix, holder.start_env, holder._idle)
    return True


def _adopt(pool: WarmPool) -> list[WarmProcess]:
    """Hand the prestarted interpreters to ``pool``; ones it cannot use are returned."""
    global _prestarted
    held, _prestarted = _prestarted, None
    if held is None:
        return []
    if held.prefix == pool.prefix and _startup_env(held.start_env) == _startup_env(pool.start_env):
        pool._idle.extend(held.procs[: pool.size])
        return held.procs[pool.size :]
    log.debug("warm pool: prestarted interpreters do not match %r; discarding", pool.prefix)
    return held.procs


def _wait_quietly(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(_KILL_TIMEOUT)


@contextlib.asynccontextmanager
async def open_warm_pool(
    prefix: Sequence[str],
    size: int,
    *,
    replenish_delay: float = DEFAULT_REPLENISH_DELAY,
    preload: Sequence[str] = (),
    preload_exclude: Sequence[str] = (),
    predicted_worker: tuple[Sequence[str], Mapping[str, str], str] | None = None,
) -> AsyncIterator[WarmPool]:
    """Pre-start ``size`` interpreters as ``[*prefix, _warm_boot.py, fd]``; kill them on exit.

    ``prefix`` is ``(python, *flags)`` as :attr:`PythonEntry.prefix` gives it.
    On leaving the block (also by cancellation) every idle interpreter is
    killed with SIGKILL and reaped, shielded and bounded; interpreters already
    activated belong to their :class:`WorkerProcesses`. A pool that cannot
    spawn turns itself off (warning) and every worker is spawned fresh.
    Interpreters are started one per turn of the event loop (first the
    missing ones, before the block runs; then replacements in a background
    task after each activation), so the pool never stalls the loop for more
    than one fork. Runs on every anyio backend.

    ``preload``: module names (or ``"auto"``) that the interpreters started after
    the first hand-off import while idle, in the workers' environment, skipping
    ``preload_exclude`` (see :mod:`aelastic.workers._preload`).
    ``predicted_worker``: ``(argv, env, cwd)`` of the workers as the agent will start
    them (per-worker variables aside): the preload then starts before the first
    hand-off, in every interpreter (prestarted ones included), and ``size`` more are
    started at once for the first restart (see :meth:`PreloadPlan.predict
    <aelastic.workers._preload.PreloadPlan.predict>`). With ``preload``, the
    preload directories of SIGKILLed agents are removed first (in a thread), and
    this pool's is removed on leaving the block, after the interpreters (also by
    cancellation: shielded, bounded by a thread waited for at most 5 s).
    """
    import anyio

    from ._background import background_tasks  # not at the top: prestart needs no anyio

    if preload:  # a listing of the temp dir: off the loop
        import anyio.to_thread

        freed = await anyio.to_thread.run_sync(sweep_preload_directories)
        if freed:
            log.warning("removed preload directories that killed agents left behind: %s", freed)
    pool = WarmPool(prefix, size, replenish_delay)
    pool._wanted = anyio.Event()
    # made last before the try: nothing that could raise lies between it and the finally
    plan = pool.preload = PreloadPlan(preload, preload_exclude) if preload else None
    try:
        entry = None if predicted_worker is None else parse_python_argv(predicted_worker[0])
        if plan is not None and entry is not None and predicted_worker is not None:
            import anyio.to_thread

            _argv, env, cwd = predicted_worker
            # reads the script (auto): a small local file, off the loop all the same
            await anyio.to_thread.run_sync(
                plan.predict, entry.kind, entry.target, entry.sys_argv, env, cwd
            )
            pool.first_spares = size
        for extra in _adopt(pool):
            pool.discard(extra)
        adopted, pool._idle = pool._idle, []
        for warm in adopted:  # started before the plan existed: the first workers
            if warm.preloaded_env is None:
                pool._send_preload(warm)
            pool._idle.append(warm)
        await pool._fill_stepwise()
        async with background_tasks() as tg:
            tg.start_soon(pool._refill_forever)
            yield pool
    finally:
        try:
            await pool.aclose()
        finally:
            if plan is not None:
                await _close_plan(plan)


async def _close_plan(plan: PreloadPlan) -> None:
    """Remove the plan's directory in a thread: shielded, and waited for at most
    ``_KILL_TIMEOUT`` (a thread still at it then finishes on its own)."""
    import anyio.to_thread

    with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_TIMEOUT):
        await anyio.to_thread.run_sync(plan.close, abandon_on_cancel=True)
