"""The worker side: :func:`save` into the agent's memory, :func:`load` what to resume from.

Imports torch when first called (never at import), so ``import aelastic.checkpoint``
costs the agent nothing. Not thread-safe: call from one thread per process.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import errno
import functools
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

from . import _buffer, _statepickle, _torchfile
from . import _layout as L
from ._exceptions import CheckpointError

__all__ = ("load", "reserve", "save", "wait")

#: ``{rank: step}`` saved by this process (a step lower than the last is refused).
_last_saved: dict[int, int] = {}
#: Set when the asynchronous save or buffer preparation in flight (at most one) is done.
_background: threading.Event | None = None
#: Whether :func:`wait` runs at interpreter exit (registered with the first thread).
_exit_waits = False
#: What the last background save raised, for the next :func:`wait`.
_failed: list[CheckpointError] = []
#: Pinned host buffers CUDA tensors are staged through, reused from save to save.
_staging: list[Any] = []


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


def _tensors(obj: Any) -> Iterator[Any]:
    """The tensors in nested dicts, lists and tuples of ``obj``."""
    import torch

    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


class _Storages(NamedTuple):
    """The distinct tensor storages in an object (what torch.save writes)."""

    nbytes: int
    number: int
    #: whether one of them is on a CUDA device
    cuda: bool


def _storages(obj: Any) -> _Storages:
    seen: set[int] = set()
    total = 0
    cuda = False
    for tensor in _tensors(obj):
        storage = tensor.untyped_storage()
        key = storage._cdata  # one per storage, whatever its device (torch.save's key)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
            cuda = cuda or tensor.is_cuda
    return _Storages(total, len(seen), cuda)


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n / (1 << 20):.1f} MiB"


def _check_memory(root: str, needed: int, where: str = "aelastic.checkpoint.save") -> None:
    try:
        free = shutil.disk_usage(root).free
    except OSError as exc:
        raise CheckpointError(
            f"{where}: cannot use the checkpoint directory {root}: "
            f"{exc.strerror}; it must be a directory the worker can write (the agent creates it)"
        ) from None
    if needed > free:
        raise CheckpointError(
            f"{where}: not enough memory for this checkpoint: it needs about "
            f"{_size(needed)}, {_size(free)} is free in {root}; free memory, grow /dev/shm "
            "(e.g. docker --shm-size) or save less state; the previous step is intact"
        )


def save(obj: Any, *, step: int, asynchronous: bool = False) -> None:
    """Save this rank's ``obj`` as ``step`` into memory the node's agent owns.

    ``obj``: nested dicts, lists and tuples of tensors and picklable values (a model's
    and an optimizer's ``state_dict()``, RNG states, the step). The tensors' bytes are
    copied once into a shared-memory file of this rank that the agent owns and that is
    reused from step to step (only the small structure around them is pickled; the file
    is a ``torch.save`` file, read with ``torch.load``), then committed by a rename. A
    worker that dies before the rename leaves the previous step intact; the agent keeps
    the two newest steps of each rank and frees them when the job ends.

    ``asynchronous=False``: returns once the step is committed.

    ``asynchronous=True``: returns once ``obj``'s tensors may change. CPU tensors are
    copied before it returns (that copy is the whole cost of a save on the CPU). CUDA
    tensors are copied to pinned host memory by non-blocking transfers enqueued on the
    current stream of their device, and a thread of this process writes the step once
    they finished: the caller may at once run work on those streams that changes the
    tensors (``optimizer.step()``, the next forward and backward), as it runs after the
    copies; work on another stream, or a host write into a tensor's memory, must first
    wait for the current stream (``stream.wait_stream(torch.cuda.current_stream())``).
    The next ``save`` (and :func:`wait`) waits for this one and raises its error; a crash
    before it is committed leaves the previous step intact.

    CUDA tensors come back on the CPU (see :func:`load`). Every rank saves its own
    object (sharded states work); a step counts as complete once every rank of the
    world saved it.

    Raises:
        CheckpointError: not under ``aelastic run``; ``step`` is lower than the last
            step this rank saved; ``obj`` cannot be serialized; the node lacks the
            memory (needed and free are named); the directory is not writable; the
            asynchronous save before this one failed. The previous step is intact in
            each case.
    """
    wait()
    root = _memory_dir()
    rank, world = _rank_and_world()
    check_order(rank, step, "save")
    pickled = _statepickle.dumps(obj)  # None: a CUDA tensor, or what torch must pickle
    if pickled is not None:  # (its walk counted the storages)
        nbytes = sum(storage.nbytes() for storage in pickled.storages)
        sizes = _Storages(nbytes, len(pickled.storages), False)
    else:
        sizes = _storages(obj)  # a staged object's host storages: as many, as large
    staged, events = _stage(obj, asynchronous) if sizes.cuda else (obj, [])
    if asynchronous and events:
        _last_saved[rank] = step  # the order of steps counts from the call

        def write() -> None:
            for event in events:
                event.synchronize()
            size, ready = _write(staged, sizes, root, step, rank, world, "make")
            if not ready:
                _buffer.prepare(root, rank, size)

        _in_background(write, f"step {step}")
        return
    for event in events:
        event.synchronize()
    # a staged object is another one: its pickle is made from it
    size, ready = _write(staged, sizes, root, step, rank, world, "make" if events else pickled)
    if not ready:  # the next save's buffer, prepared while training goes on
        prepare_next(root, rank, size)


def check_order(rank: int, step: int, caller: str) -> None:
    """Refuse a ``step`` that is not an int >= 0, or lower than the last one ``rank``
    saved (or resumed from)."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"aelastic.checkpoint.{caller}: step={step!r}; pass an int >= 0")
    resumed = os.environ.get(L.STEP_ENV)
    last = _last_saved.get(rank, int(resumed) if resumed else None)
    if last is not None and step < last:
        raise CheckpointError(
            f"aelastic.checkpoint.{caller}: step {step} is lower than step {last}, the last "
            f"one rank {rank} saved; steps must not go back (load() returns where to resume)"
        )


def wait() -> None:
    """Block until the asynchronous :func:`save` in flight, if any, is committed.

    Raises:
        CheckpointError: that save failed (its step is not saved; the previous is intact).
    """
    global _background
    done, _background = _background, None
    if done is not None:
        done.wait()
    if _failed:
        raise _failed.pop()


def reserve(size: Any) -> None:
    """Prepare this rank's next save buffer now, in a background thread: ``size`` is a
    byte count or an object whose tensors count (e.g. the model's ``state_dict()``).

    Call it before the first :func:`save` of a run (after building the model) so that
    save copies into pages already allocated and mapped, as every later save does; a
    resumed worker needs no call (:func:`load` prepares from the previous step's size).

    Raises:
        CheckpointError: not under ``aelastic run``.
    """
    if isinstance(size, int):
        nbytes = size + _RECORDS_BASE
    else:  # the file holds the tensors' bytes, then a record each and the pickle
        sizes = _storages(size)
        nbytes = sizes.nbytes + _RECORDS_BASE + _RECORD * sizes.number
    root = _memory_dir()
    rank, _ = _rank_and_world()
    wait()
    prepare_first(root, rank, nbytes)


#: What a ``torch.save`` file holds beside the tensors' bytes, per tensor (its zip
#: records, 64-byte alignment, its part of the pickle; measured: about 400 bytes) and
#: per file: allocated ahead with the tensors, so the first save allocates no page.
_RECORD = 1024
_RECORDS_BASE = 64 << 10


def _warm_up(root: str) -> None:
    """Tiny saves through a save's own path (its writer into a mapped file of ``root``),
    and the modules a save imports: the first call's imports and set-up (about 10 ms),
    and the interpreter's first slow runs of that code, are not paid by the first real
    save. Errors are ignored: the save reports its own."""
    import torch

    from .. import progress  # noqa: F401  # what save() reports its blocking time to

    path = os.path.join(root, f".warm_up.{os.getpid()}")
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.unlink(path)
            os.ftruncate(fd, _buffer.SLACK)
            m = _buffer.Map(_buffer.map_file(fd, _buffer.SLACK, 0), 0)  # not a buffer's
            state = {"w": torch.zeros(1)}
            try:
                for _ in range(8):
                    _torchfile.save(state, _buffer.MapWriter(fd, m), 4, 1)
            finally:
                m.mm.close()
        finally:
            os.close(fd)


def prepare_next(root: str, rank: int, nbytes: int) -> None:
    """Prepare ``rank``'s next save buffers of ``nbytes`` in the background thread."""
    _in_background(functools.partial(_buffer.prepare, root, rank, nbytes), None)


def prepare_first(root: str, rank: int, nbytes: int) -> None:
    """Prepare ``rank``'s first save of this process in the background thread: its
    buffers of ``nbytes``, then :func:`_warm_up` (off the caller's path: a resumed
    worker's :func:`load` returned 10 ms later with it)."""

    def first() -> None:
        _buffer.prepare(root, rank, nbytes)
        _warm_up(root)

    _in_background(first, None)


def _in_background(work: Callable[[], None], what: str | None) -> None:
    """Run ``work`` in the one background thread (the caller waited for the last);
    a :class:`CheckpointError` it raises goes to the next :func:`wait`."""
    global _background

    def run() -> None:
        try:
            work()
        except CheckpointError as exc:
            _failed.append(exc)
        except Exception as exc:  # reported by the next wait()
            _failed.append(
                CheckpointError(
                    f"aelastic.checkpoint: the asynchronous save of {what} failed: "
                    f"{type(exc).__name__}: {exc}; the previous step is intact"
                )
            )
        finally:
            done.set()

    global _exit_waits
    if not _exit_waits:  # an interpreter that exits finishes the save first
        atexit.register(wait)
        _exit_waits = True
    # A bare thread: threading.Thread.start() waits until the thread runs, a scheduler
    # round trip that a loaded machine made 10-16 ms of the caller's time.
    done = _background = threading.Event()
    _thread.start_new_thread(run, ())


def _write(
    obj: Any,
    sizes: _Storages,
    root: str,
    step: int,
    rank: int,
    world: int,
    pickled: _statepickle.Pickled | Literal["make"] | None,
) -> tuple[int, bool]:
    """Copy ``obj`` (its storages: ``sizes``; its pickle: see ``_torchfile.save``) into this
    rank's buffer for ``step`` and commit it (blocking); the bytes of its file, and
    whether the next save's buffer is ready."""
    buffer = rank_buffer(root, step, rank, world, sizes.nbytes, "save")
    with buffer as (writer, done):
        _torchfile.save(obj, writer, sizes.nbytes, sizes.number, pickled)
    return writer.pos, done[0]


@contextlib.contextmanager
def rank_buffer(
    root: str, step: int, rank: int, world: int, nbytes: int, caller: str
) -> Iterator[tuple[_buffer.MapWriter, list[bool]]]:
    """This rank's buffer for ``step``, at least ``nbytes`` ready, as a writer (the
    file-like ``torch.save`` takes); committed when the block ends (then the list holds
    whether the next save's buffer is ready). An exception in the block, or a lack of
    memory, leaves the previous step intact and raises :class:`CheckpointError`
    (``caller`` names the function in its message)."""
    final = L.rank_file(root, step, rank, world)
    tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{os.getpid()}.tmp")
    where = f"aelastic.checkpoint.{caller}"
    held, reuse = _buffer.plan(root, rank, step)  # the one scan of the directory
    reused = _buffer.size_of(reuse)
    if nbytes > reused:  # (a buffer that holds the tensors has the pages)
        _check_memory(root, nbytes + _buffer.SLACK - reused, where)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.dirname(final))  # in the agent's directory, which exists
        fd = _buffer.target(root, reuse, tmp)
    except OSError as exc:
        raise CheckpointError(
            f"{where}: cannot write {tmp}: {exc.strerror}; the checkpoint "
            "directory must be writable by the worker (the agent's user)"
        ) from None
    done: list[bool] = []
    try:
        writer = _buffer.MapWriter(fd, _buffer.mapping(fd, nbytes))
        yield writer, done
        writer.finish()
    except BaseException as exc:
        full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        if full or not isinstance(exc, Exception):
            _remove(tmp)  # its memory back
        else:  # its pages serve the next save
            os.replace(tmp, _buffer.spare_path(root, rank))
        with contextlib.suppress(OSError):  # the new step's directory, if it is empty
            os.rmdir(os.path.dirname(final))
        if full:
            _check_memory(root, nbytes + _buffer.SLACK, where)
            raise CheckpointError(
                f"{where}: {root} ran out of memory while saving step {step}; "
                "free memory or grow /dev/shm; the previous step is intact"
            ) from None
        if isinstance(exc, Exception) and not isinstance(exc, (OSError, CheckpointError)):
            raise CheckpointError(
                f"{where}: cannot serialize rank {rank}'s object of step "
                f"{step}: {type(exc).__name__}: {exc}; save tensors and picklable values only "
                "(e.g. state_dict()s, not modules holding lambdas or open files)"
            ) from exc
        raise
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _last_saved[rank] = step
    kept = [*(p for p in held if p != reuse), final]  # oldest first: steps only go up
    if len(kept) > 2:  # not the steady state, which took over its oldest step
        L.prune(root, (rank,))
        kept = _buffer.held_files(root, rank)
    _buffer.remember(root, rank, kept)
    done.append(_buffer.forget_others(root, rank, kept))


def _stage(obj: Any, asynchronous: bool) -> tuple[Any, list[Any]]:
    """``obj`` (which holds CUDA tensors) with its tensors replaced by host copies where
    a save needs them; the CUDA events that mark those copies finished.

    (Without CUDA tensors a save takes ``obj`` as it is: it copies it before returning.)
    Each distinct CUDA storage is copied into a pinned host buffer (reused
    from save to save) by a non-blocking transfer on its device's current stream, and
    an event is recorded there; with ``asynchronous`` the CPU tensors are copied too,
    as the caller may change them once :func:`save` returns. Views of one storage stay
    views of one host storage (what ``torch.save`` keeps). Never creates a CUDA context
    that is not there: ``is_cuda`` tensors mean the process has one.
    """
    import torch

    hosts: dict[tuple[str, int], Any] = {}
    devices: dict[str, Any] = {}
    used = 0

    def host_storage(t: torch.Tensor) -> Any:
        nonlocal used
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in hosts:
            n = storage.nbytes()
            if used < len(_staging) and _staging[used].numel() == n:
                buf = _staging[used]
            else:
                buf = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                _staging[used : used + 1] = [buf]
            used += 1
            source = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            buf.copy_(source, non_blocking=t.is_cuda)
            if t.is_cuda:
                devices[str(t.device)] = t.device
            hosts[key] = buf.untyped_storage()
        return hosts[key]

    def walk(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            if not (item.is_cuda or asynchronous):
                return item
            out = torch.empty(0, dtype=item.dtype)
            return out.set_(host_storage(item), item.storage_offset(), item.size(), item.stride())
        if isinstance(item, dict):
            copy = type(item)()
            copy.update((k, walk(v)) for k, v in item.items())
            if hasattr(item, "__dict__"):  # a state_dict's _metadata
                copy.__dict__.update(item.__dict__)
            return copy
        if isinstance(item, list):
            return [walk(v) for v in item]
        if isinstance(item, tuple):
            items = [walk(v) for v in item]
            return type(item)(*items) if hasattr(item, "_fields") else type(item)(items)
        return item

    staged = walk(obj)
    del _staging[used:]
    events = []
    for device in devices.values():
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return staged, events


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def load(
    *, rank: int | None = None, map_location: Any = "cpu", weights_only: bool = True
) -> tuple[int, Any] | None:
    """``(step, obj)`` to resume from, or None when there is no checkpoint.

    The step is the newest one that every rank of the world that saved it completed,
    as the agent found it when it started this worker (in its memory, or in
    ``--checkpoint-dir`` after a fresh launch); ``obj`` is this rank's object of that
    step, or global rank ``rank``'s (it must be on this node). After the world grew, a
    rank the saving world did not have reads rank ``RANK % saved world size``'s object,
    which its agent fetched from a peer before starting it (docs/checkpoints.md,
    "Resizing"). Outside ``aelastic run`` it returns None.

    Tensors come back on the CPU, read into this process's memory (not mapped: a later
    ``save`` reuses the pages of the oldest step). A GPU job moves them itself
    (``model.load_state_dict(obj["model"])`` copies into the parameters' devices) or
    passes ``map_location`` as ``torch.load`` takes it.

    The file is read with ``torch.load(..., weights_only=True)`` (torch's own default
    since 2.6): tensors, state dicts (optimizers' included), numbers, strings and plain
    containers, never arbitrary code. ``weights_only=False`` unpickles whatever the
    state holds (your own classes): only where every node of the job is trusted, as
    a file another node's agent copied here is read too (docs/checkpoints.md).

    Raises:
        CheckpointError: the object of ``rank`` is not on this node, or cannot be read.
    """
    raw = os.environ.get(L.STEP_ENV, "")
    if not raw:
        return None
    import torch

    step, world = int(raw), int(os.environ[L.WORLD_ENV])
    own = _rank_and_world()[0] if rank is None else rank
    want = L.source_rank(own, world) if rank is None else rank
    for root in (os.environ.get(L.DIR_ENV), os.environ.get(L.PERSIST_DIR_ENV)):
        if not root:
            continue
        path = L.rank_file(root, step, want, world)
        try:
            obj = torch.load(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError:
            continue
        except Exception as exc:
            dcp = os.path.exists(os.path.join(os.path.dirname(path), L.METADATA))
            hint = (
                "; it is a torch.distributed.checkpoint step: read it with "
                "dcp.load(state_dict, storage_reader=checkpoint.MemoryReader())"
                if dcp
                else ""
            )
            if weights_only and not hint and "weights_only" in str(exc):
                hint = (
                    "; it holds objects weights_only loading refuses: pass "
                    "load(weights_only=False) if every node of the job is trusted"
                )
            raise CheckpointError(
                f"aelastic.checkpoint.load: cannot read {path}: {type(exc).__name__}: {exc}{hint}"
            ) from exc
        memory = os.environ.get(L.DIR_ENV)
        if rank is None and memory:  # the first save finds its buffer ready
            size = os.path.getsize(path)
            wait()
            prepare_first(memory, own, size)
        return step, obj
    raise CheckpointError(
        f"aelastic.checkpoint.load: rank {want}'s object of step {step} is not on this node "
        "(in memory or in --checkpoint-dir); load(rank=...) reads ranks this node held "
        "(its own, or copies from --checkpoint-peer-copies) or a shared --checkpoint-dir"
    )
