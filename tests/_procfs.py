"""Reading Linux's ``/proc`` in tests: what a process holds."""

from __future__ import annotations

import os


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (``/proc/<pid>/fd``); empty
    when the process is gone or not readable, and without the descriptors that close
    while they are read."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes
