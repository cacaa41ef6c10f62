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


def ignored_signals(pid: int) -> set[int]:
    """The signals process ``pid`` ignores, as the kernel records them (``SigIgn`` of
    ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                bits = int(line.split(":", 1)[1], 16)
                return {n + 1 for n in range(64) if bits >> n & 1}
    raise AssertionError(f"/proc/{pid}/status has no SigIgn line")
