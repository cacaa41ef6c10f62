"""The worker side: :func:`save` into the agent's memory, :func:`load` what to resume from.

Imports torch when first called (never at import), so ``import aelastic.checkpoint``
costs the agent nothing. Not thread-safe: call from one thread per process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Any

from . import _layout as L
from ._exceptions import CheckpointError

__all__ = ("load", "save")

#: Headroom over the tensors' bytes for the zip records and the pickled values.
_OVERHEAD = 1 << 20
#: ``{rank: step}`` saved by this process (a step lower than the last is refused).
_last_saved: dict[int, int] = {}


def _memory_dir() -> str:
    root = os.environ.get(L.DIR_ENV)
    if not root:
        raise CheckpointError(
            f"aelastic.checkpoint.save needs the launcher: {L.DIR_ENV} is not set. Run "
            "the script under 'python -m aelastic run', whose agent keeps the memory "
            "the checkpoints live in"
        )
    return root


def _rank_and_world() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise CheckpointError(
            "aelastic.checkpoint: RANK and WORLD_SIZE are not set; "
            "run under 'python -m aelastic run'"
        ) from None


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the distinct tensor storages in ``obj`` (what torch.save writes)."""
    import torch

    seen: set[tuple[str, int]] = set()
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            key = (str(item.device), storage.data_ptr())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n / (1 << 20):.1f} MiB"


def _check_memory(root: str, needed: int) -> None:
    try:
        free = shutil.disk_usage(root).free
    except OSError as exc:
        raise CheckpointError(
            f"aelastic.checkpoint.save: cannot use the checkpoint directory {root}: "
            f"{exc.strerror}; it must be a directory the worker can write (the agent creates it)"
        ) from None
    if needed > free:
        raise CheckpointError(
            f"aelastic.checkpoint.save: not enough memory for this checkpoint: it needs about "
            f"{_size(needed)}, {_size(free)} is free in {root}; free memory, grow /dev/shm "
            "(e.g. docker --shm-size) or save less state; the previous step is intact"
        )


def save(obj: Any, *, step: int) -> None:
    """Save this rank's ``obj`` as ``step`` into memory the node's agent owns.

    ``obj``: nested dicts, lists and tuples of tensors and picklable values (a model's
    and an optimizer's ``state_dict()``, RNG states, the step). Written with
    ``torch.save`` to a file in the agent's shared-memory directory, then committed by
    a rename: returns once it is committed, so the worker's own memory can change at
    once. A worker that dies before the rename leaves the previous step intact; the
    agent keeps the two newest steps of each rank and frees them when the job ends.
    CUDA tensors are copied to host memory by ``torch.save`` (and come back on the
    CPU, see :func:`load`).

    Every rank saves its own object (sharded states work); a step counts as complete
    once every rank of the world saved it.

    Raises:
        CheckpointError: not under ``aelastic run``; ``step`` is lower than the last
            step this rank saved; ``obj`` cannot be serialized; the node lacks the
            memory (needed and free are named); the directory is not writable. The
            previous step is intact in each case.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"aelastic.checkpoint.save: step={step!r}; pass an int >= 0")
    import torch

    root = _memory_dir()
    rank, world = _rank_and_world()
    resumed = os.environ.get(L.STEP_ENV)
    last = _last_saved.get(rank, int(resumed) if resumed else None)
    if last is not None and step < last:
        raise CheckpointError(
            f"aelastic.checkpoint.save: step {step} is lower than step {last}, the last one "
            f"rank {rank} saved; steps must not go back (load() returns where to resume)"
        )
    final = L.rank_file(root, step, rank, world)
    tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{os.getpid()}.tmp")
    reuse = _oldest_file(root, rank, step)
    reused = _size_of(reuse) if reuse else 0
    _check_memory(root, _tensor_bytes(obj) + _OVERHEAD - reused)
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if reuse:
            # Overwriting pages tmpfs already holds skips allocating and zeroing new
            # ones: about a third of the time of writing a new file.
            with contextlib.suppress(FileNotFoundError):
                os.rename(reuse, tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        raise CheckpointError(
            f"aelastic.checkpoint.save: cannot write {tmp}: {exc.strerror}; the checkpoint "
            "directory must be writable by the worker (the agent's user)"
        ) from None
    try:
        with open(fd, "wb") as f, _no_crc32():
            torch.save(obj, f)
            f.truncate()
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            _check_memory(root, _tensor_bytes(obj) + _OVERHEAD)
            raise CheckpointError(
                f"aelastic.checkpoint.save: {root} ran out of memory while saving step {step}; "
                "free memory or grow /dev/shm; the previous step is intact"
            ) from None
        if isinstance(exc, Exception) and not isinstance(exc, OSError):
            raise CheckpointError(
                f"aelastic.checkpoint.save: cannot serialize rank {rank}'s object of step "
                f"{step}: {type(exc).__name__}: {exc}; save tensors and picklable values only "
                "(e.g. state_dict()s, not modules holding lambdas or open files)"
            ) from exc
        raise
    os.rename(tmp, final)
    _last_saved[rank] = step
    L.prune(root, (rank,))


def _oldest_file(root: str, rank: int, step: int) -> str | None:
    """This rank's file of its oldest step, if it holds two (that step goes with this save)."""
    held = sorted(
        (s for s in L.scan(root).values() if s.holds_any((rank,)) and s.step != step),
        key=lambda s: s.step,
    )
    if len(held) < 2:
        return None
    oldest = held[0]
    world = next(w for w, files in oldest.ranks.items() if rank in files)
    return L.rank_file(root, oldest.step, rank, world)


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _no_crc32() -> contextlib.AbstractContextManager[object]:
    """torch.save without the zip records' CRC-32 (a third of its time; torch.load does
    not need it) for this call only."""
    from torch.utils.serialization import config

    patch: contextlib.AbstractContextManager[object] = config.patch(  # type: ignore[attr-defined]
        {"save.compute_crc32": False}
    )
    return patch


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def load(*, rank: int | None = None, map_location: Any = "cpu") -> tuple[int, Any] | None:
    """``(step, obj)`` to resume from, or None when there is no checkpoint.

    The step is the newest one that every rank of the world that saved it completed,
    as the agent found it when it started this worker (in its memory, or in
    ``--checkpoint-dir`` after a fresh launch); ``obj`` is this rank's object of that
    step, or global rank ``rank``'s (for replicated states read after the world size
    changed; it must be on this node). Outside ``aelastic run`` it returns None.

    Tensors come back on the CPU, read into this process's memory (not mapped: a later
    ``save`` reuses the pages of the oldest step). A GPU job moves them itself
    (``model.load_state_dict(obj["model"])`` copies into the parameters' devices) or
    passes ``map_location`` as ``torch.load`` takes it.

    Raises:
        CheckpointError: the object of ``rank`` is not on this node, or cannot be read.
    """
    raw = os.environ.get(L.STEP_ENV, "")
    if not raw:
        return None
    import torch

    step, world = int(raw), int(os.environ[L.WORLD_ENV])
    want = _rank_and_world()[0] if rank is None else rank
    for root in (os.environ.get(L.DIR_ENV), os.environ.get(L.PERSIST_DIR_ENV)):
        if not root:
            continue
        path = L.rank_file(root, step, want, world)
        try:
            obj = torch.load(path, map_location=map_location, weights_only=False)
        except FileNotFoundError:
            continue
        except Exception as exc:
            raise CheckpointError(
                f"aelastic.checkpoint.load: cannot read {path}: {type(exc).__name__}: {exc}"
            ) from exc
        return step, obj
    raise CheckpointError(
        f"aelastic.checkpoint.load: rank {want}'s object of step {step} is not on this node "
        "(in memory or in --checkpoint-dir); load(rank=...) reads ranks this node held "
        "(its own, or copies from --checkpoint-replicas) or a shared --checkpoint-dir"
    )
