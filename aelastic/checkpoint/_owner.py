"""Memory directories with an owner: what a killed agent left in ``/dev/shm`` is found and freed.

An agent that is SIGKILLed (or whose node's processes are killed by an OOM killer) never
removes its directory, and ``/dev/shm`` is memory. Each agent holds an exclusive
``flock`` on ``<dir>/.owner`` for as long as it lives (the kernel drops it when the
process dies, in whatever PID namespace), so the next agent on the node can tell an
abandoned directory from a live one and free it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

__all__ = ("claim", "release_if_empty", "sweep_abandoned")

PREFIX = "aelastic_ckpt_"
_OWNER = ".owner"


def claim(root: str, label: str) -> tuple[str, int]:
    """Create this agent's directory in ``root``; ``(path, fd of the held lock)``.

    The directory is prepared under a hidden name and renamed once locked, so a sweep
    by another agent never sees it unlocked. Blocking (a few system calls).
    """
    hidden = tempfile.mkdtemp(prefix=f".{PREFIX}{label}_", dir=root)
    fd = os.open(os.path.join(hidden, _OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    path = os.path.join(root, os.path.basename(hidden)[1:])
    os.rename(hidden, path)
    return path, fd


def sweep_abandoned(root: str) -> list[str]:
    """Remove the directories in ``root`` whose agent died; return their paths. Blocking."""
    freed = []
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
        for name in names:
            path = os.path.join(root, name)
            try:
                fd = os.open(os.path.join(path, _OWNER), os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue  # not ours, or already gone
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its agent lives
            finally:
                os.close(fd)  # closing drops the lock we may have taken
            shutil.rmtree(path, ignore_errors=True)
            freed.append(path)
    return freed


def release_if_empty(path: str) -> bool:
    """Remove the claimed directory ``path`` if it holds nothing but its owner file.

    A few system calls on tmpfs (the scan stops at the first other entry), cheap enough
    for the event loop: a job that saved no checkpoint ends without a thread hand-off.
    Returns False, touching nothing, when something else is there: the owner file stays
    until the caller's ``rmtree``, so an agent killed before that still leaves a
    directory the next sweep frees. True when ``path`` is gone.
    """
    try:
        with os.scandir(path) as entries:
            if any(entry.name != _OWNER for entry in entries):
                return False
    except FileNotFoundError:
        return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, _OWNER))
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # something appeared meanwhile: the caller's rmtree removes it
    return True
