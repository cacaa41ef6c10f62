"""A rank's save buffers: shared-memory files mapped once, reused from step to step.

Worker side, standard library only. A save writes into the file of this rank's oldest
kept step (renamed away first, so readers never see it change: see ``_layout``), or
into this rank's *spare* (``.spare_rank_<rank>`` in the agent's directory) while it
keeps fewer than two steps, else into a new file. Each file is mapped into the worker
once (``MAP_POPULATE``: page tables filled in one system call) and the mapping is kept
while the file is one of the rank's buffers, so a steady-state save is one copy of the
bytes into pages tmpfs already holds: no page faults, no zeroing, no system call per
chunk.

Pages are allocated with ``posix_fallocate`` before they are written through the
mapping: a full ``/dev/shm`` then fails a save with ``ENOSPC`` (the previous step
intact) instead of killing the worker with ``SIGBUS``.

:func:`prepare` allocates and maps the next save's buffer ahead of time, in a thread
of the worker: after each save (for the step after), when :func:`aelastic.checkpoint.load`
resumes (the previous attempt's files) and from :func:`aelastic.checkpoint.reserve` (a
size hint before the first save). The next save waits for it, so at most one runs.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
from typing import Any

from .._dataclass import dataclass
from . import _layout as L

__all__ = (
    "Map",
    "MapWriter",
    "allocate_mapped",
    "forget_others",
    "held_files",
    "map_file",
    "plan",
    "prepare",
    "remember",
    "size_of",
    "spare_path",
    "target",
)

#: Mapped beyond the bytes the tensors need: room for the pickled structure and the
#: zip records, so a save never remaps.
SLACK = 1 << 20
_PAGE = mmap.PAGESIZE


@dataclass
class Map:
    """A file's mapping and how much of the file is known to have pages."""

    mm: mmap.mmap
    #: bytes from the file's start known to be allocated (written or fallocated)
    allocated: int


#: ``{(st_dev, st_ino): mapping}`` of this process's buffers.
_maps: dict[tuple[int, int], Map] = {}
_lock = threading.Lock()


@functools.cache
def spare_path(root: str, rank: int, index: int = 0) -> str:
    return os.path.join(root, f".spare_rank_{rank}_{index}")


#: Spares per rank: a rank keeps two steps, so at most two saves find no step to reuse.
_SPARES = 2


def held_files(root: str, rank: int, but: int | None = None) -> list[str]:
    """This rank's committed files, oldest step first (``but``: a step to leave out)."""
    held = sorted(
        (s for s in L.scan(root).values() if s.holds_any((rank,)) and s.step != but),
        key=lambda s: s.step,
    )
    out = []
    for s in held:
        world = next(w for w, files in s.ranks.items() if rank in files)
        out.append(L.rank_file(root, s.step, rank, world))
    return out


#: ``{(root, rank): files}``: the committed files of a rank this process saves, oldest
#: step first, as its last save left them. Only this process writes its rank's files
#: while it runs; the list is checked before use all the same (a file gone: a scan).
_held: dict[tuple[str, int], list[str]] = {}


def remember(root: str, rank: int, held: list[str]) -> None:
    """Note ``rank``'s committed files after a save (oldest step first)."""
    _held[(root, rank)] = list(held)


def plan(root: str, rank: int, step: int) -> tuple[list[str], str | None]:
    """What the save of ``step`` finds: this rank's committed files (oldest step first,
    ``step`` left out) and the file it writes into, if one exists: the oldest of two
    kept steps (that step goes with the save), else a spare. The files are the ones the
    last save of this process left if they are all still there (a stat each), else a
    scan of the directory (the first save, after a failed one)."""
    known = _held.get((root, rank))
    if known is not None and all(os.path.exists(p) for p in known):
        held = [p for p in known if L.step_of(p) != step]
    else:
        held = held_files(root, rank, step)
    if len(held) >= 2:
        return held, held[0]
    spares = (spare_path(root, rank, i) for i in range(_SPARES))
    return held, next((p for p in spares if os.path.exists(p)), None)


def target(root: str, reuse: str | None, tmp: str) -> int:
    """Rename ``reuse`` (a file whose pages the new one takes over: the buffer a save
    reuses, from :func:`plan`, or the older peer copy a new one replaces) to ``tmp``, or
    create ``tmp``; its descriptor. A step left without files loses its directory.
    Raises OSError."""
    if reuse is not None:
        with contextlib.suppress(FileNotFoundError):
            os.rename(reuse, tmp)
        if os.path.dirname(reuse) != root:  # a step's file, not a spare
            L.remove_if_done(os.path.dirname(reuse))
    return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def size_of(path: str | None) -> int:
    """Bytes of ``path`` (0: None, or gone)."""
    if path is None:
        return 0
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _allocate(fd: int, start: int, end: int) -> None:
    if end > start:
        os.posix_fallocate(fd, start, end - start)


#: ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+): page tables of a range filled at once.
#: The standard library names it from Python 3.12 on (``mmap.MADV_POPULATE_WRITE``);
#: before that, Linux's value from ``<asm-generic/mman-common.h>`` (the same on every
#: Linux architecture). A kernel without it refuses with EINVAL: ``map_file`` then maps
#: with ``MAP_POPULATE``.
_POPULATE_WRITE: int = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def map_file(fd: int, length: int, populate: int) -> mmap.mmap:
    """``fd`` mapped ``length`` long, the page tables of its first ``populate`` bytes
    filled (only those: populating the slack past them would allocate pages that the
    save's final truncation frees again, tens of ms per MiB on some machines).

    Filling them takes milliseconds per hundred MiB; it runs without the GIL, so the
    training thread goes on while a background preparation fills them."""
    mm = mmap.mmap(fd, length, flags=mmap.MAP_SHARED)
    if populate > 0:
        try:
            _populate(mm, -(-populate // _PAGE) * _PAGE)
        except (OSError, ValueError, AttributeError):  # an older kernel: populated whole
            mm.close()
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, length, flags=flags)  # (the mmap call drops the GIL)
    return mm


def _populate(mm: mmap.mmap, length: int, start: int = 0) -> None:
    """``madvise(MADV_POPULATE_WRITE)`` on ``length`` bytes of ``mm`` from ``start`` (a
    multiple of the page size), through ctypes, which drops the GIL for the call
    (``mmap.madvise`` holds it: measured, a save's background preparation of 512 MiB
    then stopped the training thread for 126 ms). Raises OSError when the kernel
    refuses (older than 5.14)."""
    import ctypes

    libc = _libc()
    anchor = ctypes.c_char.from_buffer(mm)  # the mapping's address (pins it meanwhile)
    try:
        address = ctypes.addressof(anchor)
    finally:
        del anchor
    if libc.madvise(address + start, length, _POPULATE_WRITE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@functools.cache
def _libc() -> Any:
    """The C library, with ``madvise``'s signature (loaded once)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


def allocate_mapped(fd: int, mm: mmap.mmap, start: int, end: int) -> None:
    """Allocate the pages of bytes ``start`` (a multiple of the page size) to ``end`` of
    the file ``fd`` and fill their page tables in ``mm``, its mapping (blocking, without
    the GIL: run it in a worker thread). Raises OSError (``ENOSPC``: not enough shared
    memory)."""
    _allocate(fd, start, end)
    with contextlib.suppress(OSError):  # an older kernel: faulted in as they are written
        _populate(mm, -(-(end - start) // _PAGE) * _PAGE, start)


def mapping(fd: int, nbytes: int) -> Map:
    """The mapping of the file ``fd`` (a save's, renamed away from readers), at least
    ``nbytes + SLACK`` long, its first ``nbytes`` allocated. Raises OSError
    (``ENOSPC``: not enough shared memory)."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    length = -(-(nbytes + SLACK) // _PAGE) * _PAGE
    with _lock:
        m = _maps.get(key)
        known = m.allocated if m is not None else min(st.st_size, st.st_blocks * 512)
        _allocate(fd, known, nbytes)
        if os.fstat(fd).st_size < length:
            os.ftruncate(fd, length)  # sparse: no pages until written
        if m is None:
            m = _maps[key] = Map(map_file(fd, length, nbytes), known)
        elif len(m.mm) < length:
            m.mm.resize(length)  # the pages mapped so far stay mapped
        m.allocated = max(known, nbytes)
        return m


def _map_committed(fd: int) -> None:
    """Map a committed file as it is (its size and bytes must not change: readers may
    be reading it), so the save that takes it over finds its pages mapped."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    with _lock:
        if key not in _maps and st.st_size > 0:
            known = min(st.st_size, st.st_blocks * 512)
            _maps[key] = Map(map_file(fd, st.st_size, known), known)


class MapWriter:
    """A file-like object ``torch.save`` writes into a mapping: each ``write`` is one
    copy into the mapped pages (a tensor's bytes arrive as one memoryview of them)."""

    def __init__(self, fd: int, m: Map) -> None:
        self.fd, self.m, self.pos = fd, m, 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        end = self.pos + view.nbytes
        m = self.m
        if end > m.allocated:  # the tail past the tensors' bytes: a few pages
            grow = max(end, m.allocated + SLACK)
            _allocate(self.fd, m.allocated, grow)
            m.allocated = grow
        if end > len(m.mm):
            m.mm.resize(-(-(end + SLACK) // _PAGE) * _PAGE)
        m.mm[self.pos : end] = view
        self.pos = end
        return view.nbytes

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        pass

    def finish(self) -> None:
        """Cut the file to the bytes written (the zip's end record must end it); the
        pages past it are freed."""
        os.ftruncate(self.fd, self.pos)
        self.m.allocated = min(self.m.allocated, self.pos)


def forget_others(root: str, rank: int, held: list[str] | None = None) -> bool:
    """Unmap what is no longer one of ``rank``'s buffers (a mapping would keep the
    memory of a deleted file); whether the next save's buffer is mapped already (the
    steady state, and the two saves after :func:`prepare` made spares: nothing to
    prepare). ``held``: the rank's committed files, oldest first, when the caller knows
    them (None: scanned)."""
    if held is None:
        held = held_files(root, rank)
    spares = [spare_path(root, rank, i) for i in range(_SPARES)]
    keys: dict[str, tuple[int, int]] = {}
    for path in (*held, *spares):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            keys[path] = (st.st_dev, st.st_ino)
    # what the next save writes into (see plan): the older of two held steps, else the
    # first spare there is
    following = held[0] if len(held) >= _SPARES else next((p for p in spares if p in keys), None)
    with _lock:
        kept = set(keys.values())
        for key in [k for k in _maps if k not in kept]:
            _maps.pop(key).mm.close()
        return following is not None and keys.get(following) in _maps


def prepare(root: str, rank: int, nbytes: int) -> None:
    """Allocate and map the buffers the next two saves of ``rank`` write into, ``nbytes``
    each (blocking; run in a thread): this rank's oldest kept step if it keeps two (mapped
    as it is), and a spare for each save that finds no step to reuse. Errors are
    ignored: the save itself reports them."""
    held = held_files(root, rank)
    remember(root, rank, held)  # the next save's plan needs no scan
    with contextlib.suppress(OSError, ValueError):
        if len(held) >= 2:
            fd = os.open(held[0], os.O_RDWR | os.O_CLOEXEC)
            try:
                _map_committed(fd)
            finally:
                os.close(fd)
        paths = [spare_path(root, rank, i) for i in range(_SPARES)]
        paths.sort(key=lambda p: not os.path.exists(p))  # the existing ones first
        wanted = max(0, _SPARES - len(held))
        for path in paths[wanted:]:  # a spare no save will take: its memory back
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        for path in paths[:wanted]:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                mapping(fd, nbytes)
            finally:
                os.close(fd)
