"""The health checks a node runs before it joins a round.

A check is a name and a coroutine function returning ``(ok, detail)``; raising is a
failure too. Kinds: a shell command (``--node-health-check CMD``: exit 0 is healthy),
a Python callable (entry-point group ``aelastic.health_checks``), and the built-ins:
the log directory is writable and has free space, memory is available, and the GPUs
answer through NVML (skipped, and said so, without the bindings or GPUs). Every
blocking call (a file write on a possibly hung file system, NVML) runs in a worker
thread; the gate (:mod:`._gate`) bounds each check's time.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._dataclass import dataclass
from .._entry_points import entry_points_of
from ._exceptions import NodeHealthConfigError

__all__ = (
    "ENTRY_POINT_GROUP",
    "HealthCheck",
    "SKIPPED",
    "builtin_checks",
    "callable_check",
    "command_check",
    "entry_point_checks",
    "free_memory_check",
    "log_dir_check",
    "nvml_check",
)

#: Entry-point group of Python health checks: ``name = "package.module:function"``.
ENTRY_POINT_GROUP = "aelastic.health_checks"
#: The detail prefix of a check that could not apply here (it counts as passed).
SKIPPED = "skipped: "
#: Bytes of a failing command's output kept for the reason (its tail).
_OUTPUT_KEPT = 512

Outcome = tuple[bool, str]


@dataclass(frozen=True)
class HealthCheck:
    """A named check: ``await check.run()`` returns ``(ok, detail)`` or raises (failed).

    ``detail`` starting with :data:`SKIPPED` marks a check that does not apply here.
    """

    name: str
    run: Callable[[], Awaitable[Outcome]]


def command_check(command: str) -> HealthCheck:
    """``/bin/sh -c command``: healthy when it exits 0.

    The command runs in a session of its own; cancelling the check (the gate's timeout)
    SIGKILLs its whole process group and reaps it. The reason of a failure carries the
    exit status and the tail of its output (stdout and stderr).
    """
    if not command.strip():
        raise NodeHealthConfigError(
            "--node-health-check: empty command; pass a shell command whose exit 0 means healthy"
        )

    async def run() -> Outcome:
        process = await anyio.open_process(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tail = b""
        try:
            assert process.stdout is not None
            async for chunk in process.stdout:
                tail = (tail + chunk)[-_OUTPUT_KEPT:]
            code = await process.wait()
        finally:
            if process.returncode is None:
                with anyio.CancelScope(shield=True):
                    _kill_group(process.pid)
                    await process.wait()
            with anyio.CancelScope(shield=True):
                await process.aclose()
        text = tail.decode(errors="replace").strip().replace("\n", " | ")
        if code == 0:
            return True, ""
        return False, f"exit status {code}" + (f": {text}" if text else "")

    return HealthCheck(command, run)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def callable_check(name: str, function: Callable[[], Any]) -> HealthCheck:
    """A Python check: a function or coroutine function taking no argument.

    It fails by raising or by returning ``False`` (or a ``(False, reason)`` pair);
    ``None``, ``True`` or a string (a detail) pass. A plain function runs in a worker
    thread (abandoned, not stopped, if it outlives the gate's timeout).
    """

    async def run() -> Outcome:
        if inspect.iscoroutinefunction(function):
            value = await function()
        else:
            value = await anyio.to_thread.run_sync(function, abandon_on_cancel=True)
        return _outcome(value)

    return HealthCheck(name, run)


def _outcome(value: Any) -> Outcome:
    if isinstance(value, tuple) and len(value) == 2:
        return bool(value[0]), str(value[1])
    if value is False:
        return False, "returned False"
    if isinstance(value, str):
        return True, value
    return True, ""


def entry_point_checks(group: str = ENTRY_POINT_GROUP) -> list[HealthCheck]:
    """A check per entry point of ``group``; a check whose entry point cannot be loaded
    fails with the import error (a broken install is an unhealthy node)."""
    checks = []
    for ep in entry_points_of(group):

        def load(ep: Any = ep) -> Any:
            return ep.load()()

        checks.append(callable_check(f"{group}:{ep.name}", load))
    return checks


def log_dir_check(log_dir: str | None, min_free_bytes: int) -> HealthCheck:
    """The log directory (or the temp dir its default lives in) can be written and has
    ``min_free_bytes`` free. Skipped for ``os.devnull`` (no logs)."""

    def probe() -> Outcome:
        if log_dir == os.devnull:
            return True, SKIPPED + "no log files (--log-dir /dev/null)"
        where = log_dir or tempfile.gettempdir()
        existing = where
        while not os.path.exists(existing):  # the launcher creates it: check its parent
            parent = os.path.dirname(os.path.abspath(existing))
            if parent == existing:
                break
            existing = parent
        free = shutil.disk_usage(existing).free
        if free < min_free_bytes:
            return False, f"{existing}: {_mib(free)} free, need {_mib(min_free_bytes)}"
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".aelastic-health-") as f:
            f.write(b"ok")
            f.flush()
        return True, f"{existing}: {_mib(free)} free"

    return HealthCheck("log_dir", _in_thread(probe))


def free_memory_check(min_available_bytes: int, meminfo: str = "/proc/meminfo") -> HealthCheck:
    """``MemAvailable`` of ``/proc/meminfo`` is at least ``min_available_bytes``
    (skipped where there is no such file)."""

    def probe() -> Outcome:
        try:
            with open(meminfo, "rb") as f:
                text = f.read(1 << 16).decode("ascii", "replace")
        except FileNotFoundError:
            return True, SKIPPED + f"no {meminfo}"
        for line in text.splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                if available < min_available_bytes:
                    return False, (f"{_mib(available)} available, need {_mib(min_available_bytes)}")
                return True, f"{_mib(available)} available"
        return True, SKIPPED + f"no MemAvailable in {meminfo}"

    return HealthCheck("memory", _in_thread(probe))


def nvml_check() -> HealthCheck:
    """Every GPU answers a memory query through NVML (``pynvml``, from nvidia-ml-py).

    Skipped, and said so, when the bindings are not installed, the driver does not
    load or there is no GPU. A GPU that fell off the bus fails the check.
    """

    def probe() -> Outcome:
        try:
            import pynvml  # type: ignore[import-not-found]
        except ImportError:
            return True, SKIPPED + "NVML bindings (nvidia-ml-py) not installed"
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            return True, SKIPPED + f"NVML did not start ({exc}): no NVIDIA driver"
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            if count == 0:
                return True, SKIPPED + "no GPU"
            for index in range(count):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    pynvml.nvmlDeviceGetMemoryInfo(handle)
                except Exception as exc:
                    return False, f"GPU {index} does not answer NVML: {exc}"
            return True, f"{count} GPU(s) answer"
        finally:
            pynvml.nvmlShutdown()

    return HealthCheck("gpu", _in_thread(probe))


def builtin_checks(log_dir: str | None) -> list[HealthCheck]:
    """The cheap checks on by default: log directory (1 GiB free), memory (512 MiB), GPUs."""
    return [log_dir_check(log_dir, 1 << 30), free_memory_check(512 << 20), nvml_check()]


def _in_thread(probe: Callable[[], Outcome]) -> Callable[[], Awaitable[Outcome]]:
    async def run() -> Outcome:
        return await anyio.to_thread.run_sync(probe, abandon_on_cancel=True)

    return run


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
