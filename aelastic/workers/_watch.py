"""How the agent learns that a worker exited: a pidfd (Linux >= 5.3) or the loop's child watcher.

Kept apart from :mod:`._processes` (which imports asyncio) so the warm pool can
decide whether it may pre-start interpreters before the launcher's heavy imports.
"""

from __future__ import annotations

import os

__all__ = ("WATCHER_ENV",)

#: ``pidfd`` (Linux >= 5.3, default there) or ``asyncio`` (the loop's child watcher).
WATCHER_ENV = "AELASTIC_CHILD_WATCHER"


def _watcher() -> str:
    forced = os.environ.get(WATCHER_ENV, "").strip().lower()
    if forced not in ("", "pidfd", "asyncio"):
        raise ValueError(f"{WATCHER_ENV}={forced!r} is not one of pidfd, asyncio (or unset)")
    if forced == "asyncio" or not _has_pidfd():
        return "asyncio"
    return "pidfd"


def _has_pidfd() -> bool:
    if not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # kernel < 5.3, or seccomp
        return False
    return True
