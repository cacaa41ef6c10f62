"""The torchft Lighthouse: check the user's, or start one and keep it running.

:func:`check_lighthouse` asks a Lighthouse for its status page (an HTTP ``GET``:
torchft's Lighthouse serves HTTP/1 beside its gRPC service).
:func:`open_lighthouse` starts ``torchft_lighthouse`` (from the installed torchft,
``aelastic[torchft]``) on a free port, restarts it on the same port whenever it
exits while the block runs, and stops it when the block is left.

Why its options (:class:`LighthouseSettings`) are not torchft's defaults. Measured with
those, a crash in one of three groups stalled the other two for 5.0 s: the Lighthouse
waits for a replica that still heartbeats but has not joined the quorum (join timeout,
60 s), and a dead replica counts as heartbeating until its heartbeat times out (5 s).
The restarted group does not help: torchft gives every restarted Manager a new replica
id, so the dead one is waited for regardless, and torchft 0.2.0 has no request that
tells the Lighthouse a replica left (its gRPC service has ``quorum`` and ``heartbeat``
only). So the join timeout is 0.1 s and the heartbeat timeout 1 s. The price, seen on a
loaded two-core CI machine with three groups of one CPU worker: the healed group asks
first, its wait already exceeds the join timeout when the next asks, and the two form a
quorum without the third, 400 steps in a row.

Restarts. torchft's ``torchft_lighthouse`` script imports torch first (15 s per start on
a loaded host, every group waiting); the extension alone starts in 0.2 s, so the
Lighthouse runs from it (``_lighthouse_main``), and the workers retry every 0.1 s
(``TORCHFT_QUORUM_RETRIES``, :data:`._settings.QUORUM_RETRIES`). A Lighthouse killed
mid-run then cost three groups a 0.4-0.5 s gap. The new one starts with no memory of the
old quorum or the heartbeats, so the first group to ask may get a quorum of its own and
step ahead; the others join a step later and heal from it. In one two-group run that heal
timed out on torchft's checkpoint lock (10 s, torchft 0.2.0, synchronous quorum) and the
healing worker failed and was restarted (a 12 s gap); in others one group's request was
left unanswered by the new Lighthouse until the Manager's quorum timeout (30 s there),
and its worker restarted (60-68 s for a job of ~20 s).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from ._exceptions import LighthouseError, ReplicaGroupConfigError
from ._settings import LighthouseSettings, parse_lighthouse_url

__all__ = ("Lighthouse", "check_lighthouse", "lighthouse_binary", "open_lighthouse")

log = logging.getLogger("aelastic.replicas")

BINARY = "torchft_lighthouse"
_LISTENING = re.compile(rb"Lighthouse listening on: \S+:(\d+)")
_STOP_GRACE = 2.0
#: restarts in a row that may fail to come up before the job is failed
_MAX_FAILED_STARTS = 5
_KEPT_LINES = 50


_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lighthouse_main.py")


def _runs_alone(binary: str) -> bool:
    """Whether ``binary`` is torchft's script run by this interpreter (then this
    interpreter can run the extension without it)."""
    try:
        with open(binary, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    mine = b"#!" + os.fsencode(sys.executable) + b"\n"
    return head.startswith(mine) and b"torchft._torchft import lighthouse_main" in head


def lighthouse_binary() -> str:
    """The path of ``torchft_lighthouse``: beside this interpreter, else on ``PATH``.

    Raises:
        ReplicaGroupConfigError: torchft is not installed.
    """
    here = os.path.join(os.path.dirname(sys.executable), BINARY)
    if os.access(here, os.X_OK):
        return here
    found = shutil.which(BINARY)
    if found is None:
        raise ReplicaGroupConfigError(
            f"replica groups need torchft's {BINARY}, found neither beside {sys.executable} "
            "nor on PATH: pip install 'aelastic[torchft]' (or give --lighthouse URL of a "
            "running Lighthouse)"
        )
    return found


async def check_lighthouse(url: str, within: float = 5.0) -> None:
    """Return once the Lighthouse at ``url`` answers its status page.

    Raises:
        ReplicaGroupConfigError: ``url`` is not ``http://HOST:PORT``.
        LighthouseError: nothing answers there within ``within`` seconds, or what
            answers is not an HTTP server (the message names the address and the fix).
    """
    host, port = parse_lighthouse_url(url)
    fix = "start torchft_lighthouse there, or leave --lighthouse out to have aelastic start one"
    try:
        with anyio.fail_after(within):
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(f"GET /status HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                head = await stream.receive(64)
    except TimeoutError:
        raise LighthouseError(f"--lighthouse {url}: no answer within {within:g} s; {fix}") from None
    except (OSError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
        reason = _reason(exc)
        raise LighthouseError(f"--lighthouse {url}: {reason}; {fix}") from None
    if not head.startswith(b"HTTP/1."):
        raise LighthouseError(f"--lighthouse {url}: what answers is not a torchft Lighthouse")


def _reason(exc: BaseException) -> str:
    """``Connection refused`` rather than anyio's ``All connection attempts failed``."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno)
    return str(cause) or type(cause).__name__


class Lighthouse:
    """A running ``torchft_lighthouse`` that :func:`open_lighthouse` keeps alive.

    ``url`` stays the same across restarts (the workers have it in their
    environment); ``restarts`` lists ``(time.time(), exit status)`` of each exit
    it was restarted after; ``tail`` its last log lines.
    """

    def __init__(self, binary: str, settings: LighthouseSettings) -> None:
        self.binary = binary
        #: what runs it: the extension alone (see ``_lighthouse_main``), not the script
        #: torchft installs, which imports torch first (seconds per restart)
        self.command = [sys.executable, _MAIN] if _runs_alone(binary) else [binary]
        self.settings = settings
        self.port = 0
        self.pid: int | None = None
        self.restarts: list[tuple[float, int]] = []
        self.tail: deque[str] = deque(maxlen=_KEPT_LINES)
        self.failure: LighthouseError | None = None
        self.log_file: anyio.AsyncFile[str] | None = None
        #: how many times a Lighthouse process started listening
        self.starts = 0
        self._listened = anyio.Event()

    async def wait_started(self, count: int) -> None:
        """Return once the Lighthouse has started listening ``count`` times in all
        (``restarts + 1`` after a restart)."""
        while self.starts < count:
            await self._listened.wait()

    @property
    def url(self) -> str:
        host = self.settings.advertise or self.settings.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    async def _keep(
        self, scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        """Run the Lighthouse until cancelled, restarting it whenever it exits.

        Started once the first process listens, or with ``failure`` set when that
        first start fails. When it later fails to come back
        ``_MAX_FAILED_STARTS`` times in a row, the error is kept in ``failure`` and
        ``scope`` (the block using it) is cancelled.
        """
        first = [True]

        def listening() -> None:
            if first[0]:
                first[0] = False
                task_status.started()

        failed_starts = 0
        while True:
            try:
                code = await self._run_once(listening)
            except LighthouseError as exc:
                failed_starts += 1
                if first[0]:  # raised by open_lighthouse, not from inside its task group
                    self.failure = exc
                    task_status.started()
                    return
                if failed_starts >= _MAX_FAILED_STARTS:
                    self.failure = exc
                    scope.cancel()
                    return
                await anyio.sleep(0.05 * failed_starts)  # let the port be released
                continue
            failed_starts = 0
            self.restarts.append((time.time(), code))
            log.warning(
                "the torchft Lighthouse (pid %s) exited with %s; restarting it on port %d",
                self.pid,
                code,
                self.port,
            )

    async def _run_once(self, listening: Callable[[], None]) -> int:
        """One Lighthouse process: start it, call ``listening`` once it listens, drain
        its log until it exits; return its exit status.

        Raises :class:`LighthouseError` when it exits or stays silent for
        ``start_timeout`` before listening. Cancellation stops it (SIGTERM, then
        SIGKILL after 2 s; shielded, bounded).
        """
        process = await anyio.open_process(
            [*self.command, *self.settings.argv(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = process.pid
        try:
            assert process.stdout is not None
            lines = BufferedByteReceiveStream(process.stdout)
            port = 0
            ended = False
            with anyio.move_on_after(self.settings.start_timeout):
                while not port and not ended:
                    line = await self._line(lines)
                    ended = line is None
                    match = _LISTENING.search(line or b"")
                    port = int(match.group(1)) if match else 0
            if not port:
                why = "exited" if ended else f"stayed silent {self.settings.start_timeout:g} s"
                raise LighthouseError(
                    f"{self.binary} {why} before listening on {self.settings.host}:"
                    f"{self.port or 'any port'}: "
                    + (" | ".join(list(self.tail)[-1:]) or "no output")
                )
            self.port = port
            self.starts += 1
            self._listened.set()
            self._listened = anyio.Event()
            listening()
            while await self._line(lines) is not None:
                pass
            return await process.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)

    async def _line(self, stream: BufferedByteReceiveStream) -> bytes | None:
        """The next line of the Lighthouse's log (kept in ``tail`` and the log file),
        or None at its end."""
        try:
            line = await stream.receive_until(b"\n", 1 << 16)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
            return None
        text = line.decode(errors="replace")
        self.tail.append(text)
        if self.log_file is not None:
            await self.log_file.write(text + "\n")
        log.debug("lighthouse: %s", text)
        return line


async def _stop(process: anyio.abc.Process) -> None:
    """Stop ``process`` (its session): SIGTERM, SIGKILL after a grace; reap it."""
    if process.returncode is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with anyio.move_on_after(_STOP_GRACE):
            await process.wait()
        if process.returncode is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    await process.aclose()


@asynccontextmanager
async def open_lighthouse(settings: LighthouseSettings | None = None) -> AsyncIterator[Lighthouse]:
    """Start ``torchft_lighthouse`` and yield it once it listens; keep it running.

    It listens on ``settings.host`` at a free port; whenever it exits while the block
    runs it is started again on the same port (a warning is logged each time). Its
    exit also ends nothing else: the workers' managers reconnect to the new one.
    Leaving the block stops it (SIGTERM, SIGKILL after 2 s).

    Raises:
        ReplicaGroupConfigError: torchft is not installed (before anything starts).
        LighthouseError: it does not start listening within ``settings.start_timeout``
            (on entry), or fails to come back five times in a row (in the block's
            block is cancelled, then this is raised).
    """
    lighthouse = Lighthouse(lighthouse_binary(), settings or LighthouseSettings())
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        if lighthouse.settings.log_path is not None:
            lighthouse.log_file = await stack.enter_async_context(
                await anyio.open_file(lighthouse.settings.log_path, "a", buffering=1)
            )
        await tg.start(lighthouse._keep, tg.cancel_scope)
        if lighthouse.failure is None:
            try:
                yield lighthouse
            finally:
                tg.cancel_scope.cancel()
    if lighthouse.failure is not None:  # the first start failed, or the block was cancelled
        raise lighthouse.failure
