"""A node's bounded history: step samples over time and marked moments (restarts, hangs...).

Both parts have a fixed capacity, so a node's published status stays small however long
the job runs. Step samples thin out as they age (when full, every other sample of the
older half is dropped): the whole run stays visible, the recent past in detail. Marks
keep the latest ones. Plain data, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ("MARK_KINDS", "History")

#: The kinds of marks aelastic itself records. Kinds are an open set of short strings:
#: any other kind (``"excluded"``...) is published and charted the same way.
MARK_KINDS = ("restart", "hang", "node_lost", "membership", "store_moved", "failed")

#: Step samples kept per node (each ``[time, step of local rank 0, 1, ...]``).
MAX_SAMPLES = 32
#: Marks kept per node (each ``[time, kind, detail]``).
MAX_MARKS = 12
#: Longest detail text kept in a mark.
MAX_DETAIL = 160


class History:
    """The step samples and marks of one node (times: ``time.time()`` seconds)."""

    def __init__(self, max_samples: int = MAX_SAMPLES, max_marks: int = MAX_MARKS) -> None:
        if max_samples < 4:
            raise ValueError(f"max_samples must be >= 4, got {max_samples}")
        self.max_samples = max_samples
        self.samples: list[list[float | int | None]] = []
        self.marks: deque[list[float | str]] = deque(maxlen=max_marks)

    def sample(self, when: float, steps: Sequence[int | None]) -> None:
        """Add the steps (by local rank; None: no report) seen at ``when``."""
        self.samples.append([round(when, 1), *steps])
        if len(self.samples) > self.max_samples:
            half = len(self.samples) // 2
            self.samples = self.samples[:half:2] + self.samples[half:]

    def mark(self, when: float, kind: str, detail: str = "") -> None:
        """Note that ``kind`` happened at ``when`` (``detail`` is cut to 160 characters)."""
        self.marks.append([round(when, 1), str(kind)[:32], str(detail)[:MAX_DETAIL]])

    def to_json(self) -> dict[str, list[list[float | int | str | None]]]:
        return {"samples": [list(s) for s in self.samples], "marks": [list(m) for m in self.marks]}
