"""Directories with an owner: what a killed process left (in ``/dev/shm``) is found and freed.

A process that is SIGKILLed (or killed by the OOM killer) never removes its directory,
and ``/dev/shm`` is memory. The owner holds an exclusive ``flock`` on ``<dir>/.owner``
for as long as it lives (the kernel drops it when the process dies, in whatever PID
namespace), so the next process on the node can tell an abandoned directory from a live
one and free it. Used by the agent for its checkpoint memory (``aelastic.checkpoint``)
and its workers' progress files (``aelastic.agent._hang``). Standard library only.

Every function is blocking (a few system calls on tmpfs; :func:`sweep_abandoned` also
removes what it frees) and raises nothing but what :func:`claim` documents.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

__all__ = ("claim", "release", "release_if_empty", "sweep_abandoned")

_OWNER = ".owner"


def claim(root: str, prefix: str) -> tuple[str, int]:
    """Create a directory named ``<prefix><random>`` in ``root``; ``(path, fd of the held lock)``.

    The directory is prepared under a hidden name and renamed once locked, so a sweep by
    another process never sees it unlocked. The lock's descriptor is close-on-exec: a
    program the owner starts does not keep the directory alive. Raises ``OSError`` when
    the directory cannot be created.
    """
    hidden = tempfile.mkdtemp(prefix=f".{prefix}", dir=root)
    try:
        fd = os.open(os.path.join(hidden, _OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except BaseException:
        os.rmdir(hidden)
        raise
    fcntl.flock(fd, fcntl.LOCK_EX)
    path = os.path.join(root, os.path.basename(hidden)[1:])
    os.rename(hidden, path)
    return path, fd


def sweep_abandoned(root: str, prefix: str) -> list[str]:
    """Remove the directories ``<prefix>*`` in ``root`` whose owner died; return their paths.

    A directory without an owner file (not made by :func:`claim`) is left alone.
    """
    freed = []
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
        for name in names:
            path = os.path.join(root, name)
            try:
                fd = os.open(os.path.join(path, _OWNER), os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue  # not claimed, or already gone
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its owner lives
            finally:
                os.close(fd)  # closing drops the lock we may have taken
            shutil.rmtree(path, ignore_errors=True)
            freed.append(path)
    return freed


def release(path: str, fd: int) -> None:
    """Remove the claimed directory ``path`` and everything in it, then drop its lock."""
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)


def release_if_empty(path: str) -> bool:
    """Remove the claimed directory ``path`` if it holds nothing but its owner file.

    A few system calls on tmpfs (the scan stops at the first other entry), cheap enough
    for the event loop: a job that saved no checkpoint ends without a thread hand-off.
    Returns False, touching nothing, when something else is there: the owner file stays
    until the caller's ``rmtree``, so an owner killed before that still leaves a
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
