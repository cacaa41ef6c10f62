"""The agent side of a progress file: create it, read a snapshot when a deadline expires."""

from __future__ import annotations

import mmap
import os

from .._dataclass import dataclass
from . import _layout as L

__all__ = ("ProgressFile", "ProgressSnapshot")


@dataclass(frozen=True)
class ProgressSnapshot:
    """What a worker reported so far (times are ``time.monotonic_ns()``; 0: never)."""

    attached: bool
    attach_ns: int
    beats: int
    last_beat_ns: int
    max_gap_ns: int
    step: int
    section: str | None
    section_ns: int
    section_exit_ns: int
    #: ``{section name: longest time spent in it (ns)}``.
    longest_sections_ns: dict[str, int]
    #: When the latest step was reported; the attempt's first step and when (0: none).
    step_ns: int = 0
    first_step: int = -1
    first_step_ns: int = 0
    #: Total time blocked saving / loading checkpoints (``checkpoint_blocked``).
    checkpoint_save_ns: int = 0
    checkpoint_load_ns: int = 0
    #: Own work and the wall time it was measured over (``work_timed``; 0: not measured).
    work_ns: int = 0
    work_span_ns: int = 0
    #: When the worker's script ended and its interpreter began its shutdown (0: not yet;
    #: see ``aelastic.progress._worker._script_ended``). An exiting worker is not hung.
    ended_ns: int = 0


class ProgressFile:
    """One worker's progress file, created zeroed (not attached) and mapped read-only.

    ``ProgressFile(path)`` creates (or truncates) the file; :meth:`snapshot` costs a
    few memory reads, no system call; :meth:`close` unmaps it (the file stays, for a
    post-mortem). Raises ``OSError`` when the file cannot be created.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, L.SIZE)
            self._map: mmap.mmap | None = mmap.mmap(fd, L.SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("B").cast("q")

    def snapshot(self) -> ProgressSnapshot:
        s = self._slots
        assert self._map is not None
        attached = s[L.ATTACHED] == L.MAGIC
        names = self._names(max(0, min(int(s[L.NAMES]), L.MAX_NAMES))) if attached else []
        index = s[L.SECTION]
        return ProgressSnapshot(
            attached=attached,
            attach_ns=s[L.ATTACH_NS],
            beats=s[L.BEATS],
            last_beat_ns=s[L.LAST_BEAT_NS],
            max_gap_ns=s[L.MAX_GAP_NS],
            step=s[L.STEP] if attached else -1,
            section=names[index - 1][0] if 0 < index <= len(names) else None,
            section_ns=s[L.SECTION_NS],
            section_exit_ns=s[L.SECTION_EXIT_NS],
            longest_sections_ns={name: longest for name, longest in names},
            step_ns=s[L.STEP_NS],
            first_step=s[L.FIRST_STEP],
            first_step_ns=s[L.FIRST_STEP_NS] if attached else 0,
            checkpoint_save_ns=s[L.CKPT_SAVE_NS],
            checkpoint_load_ns=s[L.CKPT_LOAD_NS],
            work_ns=s[L.WORK_NS],
            work_span_ns=s[L.WORK_SPAN_NS],
            ended_ns=s[L.ENDED_NS] if attached else 0,
        )

    def _names(self, count: int) -> list[tuple[str, int]]:
        assert self._map is not None
        out = []
        for i in range(count):
            offset = L.NAMES_OFFSET + i * L.NAME_SIZE
            raw = self._map[offset : offset + L.NAME_SIZE - 8].rstrip(b"\0")
            longest = int.from_bytes(
                self._map[offset + L.NAME_SIZE - 8 : offset + L.NAME_SIZE], "little", signed=True
            )
            out.append((raw.decode(errors="replace"), longest))
        return out

    def close(self) -> None:
        """Unmap the file; idempotent."""
        if self._map is not None:
            self._slots.release()
            self._map.close()
            self._map = None
