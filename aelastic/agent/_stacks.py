"""Capture the Python stacks of every thread of live workers, before they are stopped.

Workers started by this agent with hang detection on register ``faulthandler`` on
:data:`STACKS_SIGNAL` (the warm-worker bootstrap and :mod:`aelastic.progress` both
do), writing to their ``attempt_<n>/<local_rank>/stacks.txt``. A real-time signal
is used so it never clashes with ``--signals-to-handle`` (SIGUSR1/SIGUSR2
included); it is sent only to a process whose ``/proc/<pid>/status`` shows a
handler for it (an unhandled real-time signal would kill the process). Workers
without one are dumped with ``py-spy`` when it is installed. Meanwhile each worker
that waits on its flight recorder trigger writes torch's flight recorder dump next to
its stacks (:mod:`aelastic.agent._flight_recorder`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from collections.abc import Collection, Mapping

import anyio
import anyio.lowlevel

from ._flight_recorder import dump_flight_recorder

__all__ = ("STACKS_SIGNAL", "capture_stacks", "handles_signal")

log = logging.getLogger("aelastic.agent")

#: SIGRTMIN+6: unused by glibc, CPython and torch.
STACKS_SIGNAL = int(signal.SIGRTMIN) + 6 if hasattr(signal, "SIGRTMIN") else int(signal.SIGUSR2)
#: How long one worker may take to write its stacks.
CAPTURE_TIMEOUT = 1.0
_PY_SPY_TIMEOUT = 5.0
#: Between two looks at whether a dump finished (one-off, bounded by CAPTURE_TIMEOUT).
_SETTLE_INTERVAL = 0.002


def _status_masks(path: str, fields: tuple[bytes, ...]) -> list[int]:
    try:
        with open(path, "rb") as fp:
            lines = fp.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        name, _, value = line.partition(b":")
        if name in fields:
            out.append(int(value.strip(), 16))
    return out


def handles_signal(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler installed for ``signum`` (``SigCgt`` in /proc)."""
    bit = 1 << (signum - 1)
    return any(mask & bit for mask in _status_masks(f"/proc/{pid}/status", (b"SigCgt",)))


def _blocking_threads(pid: int, signum: int) -> set[str]:
    """The thread ids of ``pid`` that block ``signum`` now (``SigBlk`` in /proc)."""
    bit = 1 << (signum - 1)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set()
    return {
        tid
        for tid in tids
        if any(m & bit for m in _status_masks(f"/proc/{pid}/task/{tid}/status", (b"SigBlk",)))
    }


def _dump_pending_or_running(pid: int, signum: int, blocked_before: Collection[str]) -> bool:
    """True while ``signum`` is pending in ``pid`` or blocked by a thread running its handler.

    ``blocked_before``: the threads that blocked ``signum`` before it was sent. They block
    it for good (a thread masking the signal, not a handler running), so they are not
    waited for; the signal goes to another thread.
    """
    bit = 1 << (signum - 1)
    if any(m & bit for m in _status_masks(f"/proc/{pid}/status", (b"ShdPnd", b"SigPnd"))):
        return True
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        path = f"/proc/{pid}/task/{tid}/status"
        fields = (b"SigPnd",) if tid in blocked_before else (b"SigPnd", b"SigBlk")
        if any(m & bit for m in _status_masks(path, fields)):
            return True
    return False


async def _faulthandler_dump(pid: int, signum: int) -> bool:
    blocked_before = _blocking_threads(pid, signum)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    # Bounded: at most CAPTURE_TIMEOUT of short looks at /proc, once per hang.
    for _ in range(int(CAPTURE_TIMEOUT / _SETTLE_INTERVAL)):
        await anyio.sleep(_SETTLE_INTERVAL)
        if not _dump_pending_or_running(pid, signum, blocked_before):
            return True
    log.warning("worker pid %s did not finish writing its stacks within %s s", pid, CAPTURE_TIMEOUT)
    return False


async def _py_spy_dump(py_spy: str, pid: int, path: str) -> bool:
    with anyio.move_on_after(_PY_SPY_TIMEOUT):
        done = await anyio.run_process([py_spy, "dump", "--pid", str(pid)], check=False)
        if done.returncode == 0:
            async with await anyio.open_file(path, "ab") as fp:
                await fp.write(done.stdout)
            return True
        log.warning("py-spy could not dump pid %s: %s", pid, done.stderr.decode(errors="replace"))
    return False


async def capture_stacks(
    targets: Mapping[int, tuple[int, str]], signum: int = STACKS_SIGNAL
) -> dict[int, str]:
    """Dump the stacks of ``{local_rank: (pid, stacks file)}`` concurrently.

    Returns ``{local_rank: how}`` for the workers whose stacks were written: ``"faulthandler"``
    or ``"py-spy"``. Then each worker waiting on its flight recorder trigger is asked for
    torch's dump (written next to its stacks file, logged): only once its stacks are
    written, as faulthandler walks every thread's frames without the GIL and a dump
    thread running meanwhile could crash the worker. Bounded (a
    worker that cannot dump is skipped after :data:`CAPTURE_TIMEOUT`, py-spy after 5 s,
    a flight recorder dump after 3 s); never raises for a worker that is gone
    or refuses (an OSError for one worker is logged and skips only that worker).
    Cancellation: stops waiting; dumps already requested may still land.
    """
    captured: dict[int, str] = {}
    # On PATH, or beside this interpreter (a virtual environment that is not activated).
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))

    async def flight_recorder(path: str) -> None:
        dump = await dump_flight_recorder(path)
        if dump is not None:
            log.error("torch's flight recorder written: %s", dump)

    async def one(rank: int, pid: int, path: str) -> None:
        try:
            if handles_signal(pid, signum):
                if await _faulthandler_dump(pid, signum):
                    captured[rank] = "faulthandler"
            elif py_spy is not None and await _py_spy_dump(py_spy, pid, path):
                captured[rank] = "py-spy"
        except OSError as exc:  # not ours to signal, py-spy not runnable, file not writable
            log.warning("could not capture the stacks of pid %s: %s", pid, exc)
        await flight_recorder(path)

    async with anyio.create_task_group() as tg:
        for rank, (pid, path) in targets.items():
            tg.start_soon(one, rank, pid, path)
    return captured
