"""Where peer copies land in an agent's memory directory (agent side; the methods block:
run them in a worker thread).

A copy of a newer step of a rank is written into the pages of the older of the two steps
the agent holds for that rank (that step goes with the copy), through a mapping kept
from the copy that wrote those pages: the steady-state copy neither allocates and zeroes
tmpfs pages nor faults in page tables. A mapping stays while its file is held and is
dropped by :meth:`Landing.sweep` once the file is gone (a mapping would keep a deleted
file's memory). A mapping holds its file's inode, so a kept mapping can never be taken
for a later file's.

A new file's pages are allocated, and their page tables filled, by :meth:`Landing.allocate`
a chunk at a time in a worker thread while the bytes of the chunk before arrive
(``_peer_copies``), through ctypes (``_buffer.allocate_mapped``): ``MAP_POPULATE`` and
``mmap.madvise`` hold CPython's GIL, which stalled the agent's event loop 125-205 ms per
512 MiB here.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Sequence

from .._dataclass import dataclass
from . import _buffer as B
from . import _layout as L

__all__ = ("Landed", "Landing")


@dataclass
class Landed:
    """One file being received: its temporary name, final name, descriptor and mapping
    (None for an empty file), and how many of its bytes have pages allocated."""

    tmp: str
    final: str
    fd: int
    mm: mmap.mmap | None
    allocated: int = 0


def _key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class Landing:
    """The received files of one memory directory and their kept mappings."""

    def __init__(self, memory_dir: str) -> None:
        self.memory_dir = memory_dir
        self._maps: dict[tuple[int, int], mmap.mmap] = {}
        self._lock = threading.Lock()

    def open(self, rank: int, step: int, world: int, size: int) -> Landed:
        """A temporary file for ``rank``'s file of ``step``, ``size`` bytes long and
        mapped: the pages of ``rank``'s older held step when two steps older than
        ``step`` are held (``allocated`` says how many of its bytes have pages: the
        rest must go through :meth:`allocate` before they are written). Raises OSError
        (nothing is left behind)."""
        tmp = os.path.join(self.memory_dir, f".peer_{rank}_{os.urandom(8).hex()}.tmp")
        held = B.held_files(self.memory_dir, rank, step)
        older = len(held) >= 2 and L.step_of(held[-1]) < step
        fd = B.target(self.memory_dir, held[0] if older else None, tmp)
        try:
            had = os.fstat(fd).st_size  # a complete file's: its pages are allocated
            os.ftruncate(fd, size)
            mm = self._mapping(fd, size) if size else None
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        final = L.rank_file(self.memory_dir, step, rank, world)
        return Landed(tmp, final, fd, mm, min(had, size) // mmap.PAGESIZE * mmap.PAGESIZE)

    def allocate(self, landed: Landed, end: int) -> None:
        """Allocate the pages of ``landed``'s bytes up to ``end`` and fill their page
        tables (blocking, without the GIL: a worker thread runs it while bytes arrive
        before ``landed.allocated``). A full ``/dev/shm`` is ``ENOSPC`` here, never a
        fault while the bytes are written. Raises OSError."""
        if landed.mm is not None and end > landed.allocated:
            B.allocate_mapped(landed.fd, landed.mm, landed.allocated, end)
            landed.allocated = end

    def _mapping(self, fd: int, size: int) -> mmap.mmap:
        with self._lock:
            mm = self._maps.pop(_key(fd), None)
        if mm is not None and len(mm) >= size:
            return mm  # the page tables the last copy into these pages filled
        if mm is not None:
            mm.close()
        return B.map_file(fd, size, 0)  # page tables: filled by allocate()

    def finish(self, landed: Sequence[Landed], keep: bool) -> None:
        """Give the files their final names and keep their mappings (``keep``), or
        remove them; close them either way."""
        for f in landed:
            if keep:
                os.makedirs(os.path.dirname(f.final), exist_ok=True)
                os.rename(f.tmp, f.final)
                if f.mm is not None:
                    with self._lock:
                        self._maps[_key(f.fd)] = f.mm
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f.tmp)
                if f.mm is not None:
                    # a view still exported (kept by a traceback): unmapped once collected
                    with contextlib.suppress(BufferError):
                        f.mm.close()
            os.close(f.fd)

    def put_metadata(self, step: int, data: bytes) -> None:
        """Write a DCP step's ``.metadata`` (received with its rank files) into the
        step's directory: a temporary file, then a rename (a reader never sees half).
        Raises OSError."""
        directory = L.step_dir(self.memory_dir, step)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f"{L.METADATA}.{os.urandom(8).hex()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, os.path.join(directory, L.METADATA))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def sweep(self) -> None:
        """Unmap the kept mappings of files no longer held (replaced, pruned, dropped)."""
        held = set()
        for step in L.scan(self.memory_dir).values():
            for world, ranks in step.ranks.items():
                for rank in ranks:
                    with contextlib.suppress(OSError):
                        st = os.stat(L.rank_file(self.memory_dir, step.step, rank, world))
                        held.add((st.st_dev, st.st_ino))
        with self._lock:
            gone = [self._maps.pop(k) for k in list(self._maps) if k not in held]
        for mm in gone:
            mm.close()

    def close(self) -> None:
        """Unmap every kept mapping."""
        with self._lock:
            gone, self._maps = list(self._maps.values()), {}
        for mm in gone:
            mm.close()
