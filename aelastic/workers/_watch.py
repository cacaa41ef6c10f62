"""How the agent learns that a child exited: a pidfd (Linux >= 5.3) or a waiting thread.

Both run on every anyio backend (asyncio, uvloop, trio) and never poll. The
pidfd becomes readable the moment the child exits and is awaited with
:func:`anyio.wait_readable`; without pidfds (an old kernel, seccomp, or
``AELASTIC_CHILD_WATCHER=thread``) a worker thread blocks in ``waitid``.
Either way the child is left a zombie (``WNOWAIT``): its pid, and thus its
process group id, stays reserved until the owner reaps it.

Kept free of anyio at import time so the warm pool can decide whether it may
pre-start interpreters before the launcher's heavy imports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .._exceptions import ConfigError

if TYPE_CHECKING:
    import anyio

__all__ = ("WATCHER_ENV", "exit_code_now", "open_pidfd", "wait_exit")

#: ``pidfd`` (Linux >= 5.3, default there) or ``thread`` (``asyncio``: the old name of it).
WATCHER_ENV = "AELASTIC_CHILD_WATCHER"


def _watcher() -> str:
    """``"pidfd"`` or ``"thread"``; raises ValueError for a bad ``AELASTIC_CHILD_WATCHER``."""
    forced = os.environ.get(WATCHER_ENV, "").strip().lower()
    if forced not in ("", "pidfd", "thread", "asyncio"):
        raise ConfigError(f"{WATCHER_ENV}={forced!r} is not one of pidfd, thread (or unset)")
    if forced in ("thread", "asyncio") or not _has_pidfd():
        return "thread"
    return "pidfd"


def _has_pidfd() -> bool:
    if not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # kernel < 5.3, or seccomp
        return False
    return True


def open_pidfd(pid: int) -> int | None:
    """A pidfd for our child ``pid``, or None (no pidfd support, or out of descriptors).

    Safe only before the child is reaped: only its parent can reap it, so its
    pid cannot name another process meanwhile.
    """
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exitcode(info: os.waitid_result) -> int:
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status  # CLD_KILLED, CLD_DUMPED


def exit_code_now(pid: int) -> int | None:
    """The exit code of our exited child ``pid``, None while it runs; never blocks or reaps.

    Raises ChildProcessError when the child was already reaped.
    """
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return None if info is None else _exitcode(info)


def _wait_blocking(pid: int) -> int | None:
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped behind our back (SIGCHLD ignored, waitpid(-1))
        return None
    return None if info is None else _exitcode(info)


async def wait_exit(pid: int, pidfd: int | None, limiter: anyio.CapacityLimiter) -> int | None:
    """Wait until our child ``pid`` exits; its exit code (``-N``: killed by signal N).

    None means the child was reaped by someone else, so its status is lost and
    its pid may already be reused. The child is not reaped here. With a
    ``pidfd`` the wait is :func:`anyio.wait_readable` on it (the caller closes
    it, after this returns or is cancelled); without, a thread of ``limiter``
    blocks in ``waitid``. Cancellation is immediate; an abandoned thread
    returns when the child exits or is reaped.
    """
    import anyio.to_thread

    if pidfd is None:
        return await anyio.to_thread.run_sync(
            _wait_blocking, pid, limiter=limiter, abandon_on_cancel=True
        )
    while True:
        await anyio.wait_readable(pidfd)
        try:
            code = _exit_status(pidfd)
        except ChildProcessError:
            return None
        if code is not None:
            return code


def _exit_status(pidfd: int) -> int | None:
    """The exit code of the pidfd's exited child, None while it runs (never blocks)."""
    info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return None if info is None else _exitcode(info)
