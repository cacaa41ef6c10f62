"""The signal state a worker spawned right now would inherit from the agent.

A freshly spawned worker inherits, across fork and exec, the agent's *ignored*
signals (``SIG_IGN`` survives exec; a handler becomes ``SIG_DFL``) and the
signal mask of the thread that spawns it. A warm interpreter was started
earlier, possibly before the agent installed its handlers (a launcher started
with ``&`` or under ``nohup`` has SIGINT/SIGQUIT or SIGHUP ignored until then),
so at activation it is told this state and rebuilds it (``_warm_boot.py``).
"""

from __future__ import annotations

import signal
from collections.abc import Collection

from .._dataclass import dataclass

__all__ = ("SpawnSignals", "spawn_signals")

_STATUS = "/proc/self/status"


@dataclass(frozen=True)
class SpawnSignals:
    """Signals ignored by the agent (process-wide) and blocked in the calling thread."""

    ignored: frozenset[int]
    blocked: frozenset[int]

    def encode(self) -> tuple[bytes, bytes]:
        """Both sets as comma-separated decimal numbers (the warm activation message)."""
        return (
            ",".join(str(s) for s in sorted(self.ignored)).encode(),
            ",".join(str(s) for s in sorted(self.blocked)).encode(),
        )


def _ignored_from_proc() -> frozenset[int] | None:
    """The kernel's view (``SigIgn``), right even for dispositions set behind Python's back."""
    try:
        with open(_STATUS, "rb") as fp:
            for line in fp:
                if line.startswith(b"SigIgn:"):
                    bits = int(line.split(b":", 1)[1].strip(), 16)
                    return frozenset(i + 1 for i in range(bits.bit_length()) if bits >> i & 1)
    except (OSError, ValueError):
        pass
    return None


def _ignored_from_python() -> frozenset[int]:
    ignored = set()
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                ignored.add(int(sig))
        except (OSError, ValueError):
            continue
    return frozenset(ignored)


def spawn_signals(also_ignored: Collection[int] = ()) -> SpawnSignals:
    """What a child spawned now from this thread would start with; never raises.

    ``also_ignored``: signals the spawn sets to ``SIG_IGN`` itself (the workers'
    ``ignored_signals``, see :func:`~aelastic.workers.open_worker_processes`), added to
    what the agent ignores. Cheap (one small ``/proc`` read and one
    ``pthread_sigmask`` call). Off Linux the ignored set comes from
    :func:`signal.getsignal`.
    """
    ignored = _ignored_from_proc()
    if ignored is None:
        ignored = _ignored_from_python()
    ignored |= {int(s) for s in also_ignored}
    blocked = frozenset(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ()))
    return SpawnSignals(ignored, blocked)
