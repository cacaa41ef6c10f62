"""Make a child die with its parent: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child.

Linux only. The kernel sends the signal when the *thread* that forked the child
exits; asyncio forks in the event-loop thread, so workers die when the loop's
thread (normally the agent's main thread) dies, including by SIGKILL.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

__all__ = ("pdeathsig_preexec",)

_PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=1)
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    result: Callable[..., int] = prctl
    return result


def pdeathsig_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that arms the parent-death signal, or None off Linux.

    Everything the child runs is resolved here, in the parent, so the child
    only makes two system calls. If the parent already died between fork and
    prctl (the child was re-parented), the child kills itself at once.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    getppid = os.getppid
    kill = os.kill
    getpid = os.getpid

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if getppid() != parent:
            kill(getpid(), signal.SIGKILL)

    return preexec
