"""Process state from ``/proc`` (Linux): spot workers stuck in uninterruptible sleep."""

from __future__ import annotations

__all__ = ("process_state",)


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from ``/proc/<pid>/stat`` (``"R"``, ``"S"``, ``"D"``...).

    ``"D"`` is uninterruptible sleep: such a process ignores even SIGKILL until
    the kernel call returns (a hung GPU driver, NCCL, RDMA or network file
    system). Returns None when the process is gone or ``/proc`` is unavailable.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: the state follows the last ")".
    _, _, rest = stat.rpartition(b")")
    fields = rest.split()
    return fields[0].decode() if fields else None
