"""``torch.distributed.checkpoint`` (DCP) storage in the agent's memory: worker side.

:class:`MemoryWriter` is a ``FileSystemWriter`` whose directory is the step's directory
in the agent's memory and whose data file of rank ``r`` is that rank's file of the step
(``step_<N>/rank_<r>_of_<world>.pt``, written through the rank's reused buffer, see
``_buffer``); the coordinator adds DCP's ``.metadata`` there once every rank wrote. So a
DCP step is, to the agent, a step like any other (kept across restarts, complete once
every rank committed its file, copied to peers and to ``--checkpoint-dir``), and it is
in DCP's own format: ``dcp.load(sd, checkpoint_id=<--checkpoint-dir>/step_<N>)`` reads
the persisted step without aelastic. :class:`MemoryReader` is a ``FileSystemReader`` of
the step the agent chose; DCP's load plans reshard it to the world that loads.

Imports torch when one of the two classes is first looked up (the module itself imports
no torch): each is built then from its body here and torch's base class; without torch
that lookup raises :class:`CheckpointError` naming the fix.
"""

from __future__ import annotations

import os
import queue
from typing import TYPE_CHECKING, Any

from . import _layout as L
from . import _torchfile, _worker
from ._exceptions import CheckpointError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.filesystem import FileSystemReader as _ReaderBase
    from torch.distributed.checkpoint.filesystem import FileSystemWriter as _WriterBase
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future
else:  # the bodies below; the real bases join them in __getattr__
    _ReaderBase = _WriterBase = object

__all__ = ("MemoryReader", "MemoryWriter")


class _Stream:
    """What DCP's file writer needs of a stream, over a rank buffer's writer."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def __enter__(self) -> Any:
        return self._writer

    def __exit__(self, *exc: object) -> None:
        pass


class _MemoryWriter(_WriterBase):
    """Save a DCP checkpoint as ``step`` into the node's agent memory::

        dcp.save(state_dict, storage_writer=MemoryWriter(step=step))
        dcp.async_save(state_dict, storage_writer=MemoryWriter(step=step))

    Every rank passes the same ``step`` (an int >= 0, not lower than the last one this
    rank saved). Pass no ``checkpoint_id``: the step names the checkpoint. Each rank's
    data is one copy into its reused shared-memory buffer; nothing is fsynced (the agent
    writes to ``--checkpoint-dir`` in the background).

    Raises:
        CheckpointError: not under ``aelastic run``; a bad or lower ``step``. Failures
            while writing reach ``dcp.save``'s caller as DCP's ``CheckpointException``
            holding a :class:`CheckpointError` (the previous step intact).
    """

    def __init__(self, step: int) -> None:
        root = _worker._memory_dir()
        rank, world = _worker._rank_and_world()
        _worker.check_order(rank, step, "MemoryWriter")
        super().__init__(
            L.step_dir(root, step), single_file_per_rank=True, sync_files=False, overwrite=True
        )
        self.step = step
        self._root, self._rank, self._world = root, rank, world

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None and os.fspath(checkpoint_id) != os.fspath(self.path):
            raise CheckpointError(
                "aelastic.checkpoint.MemoryWriter: pass no checkpoint_id; the step names "
                "the checkpoint (MemoryWriter(step=...))"
            )
        super().reset()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        import torch.distributed as dist

        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if dist.is_available() and dist.is_initialized():
            self._rank, self._world = dist.get_rank(), dist.get_world_size()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        from torch.distributed.checkpoint.filesystem import _item_size, _write_files_from_queue
        from torch.distributed.checkpoint.planner import WriteItemType
        from torch.futures import Future

        _worker.wait()  # a preparation of this rank's buffers in flight
        final = L.rank_file(self._root, self.step, self._rank, self._world)
        nbytes = sum(_item_size(i) for i in plan.items if i.type != WriteItemType.BYTE_IO)
        files: queue.Queue[Any] = queue.Queue()
        results: queue.Queue[list[WriteResult]] = queue.Queue()
        files.put((final, os.path.basename(final), plan.items))
        buffer = _worker.rank_buffer(
            self._root, self.step, self._rank, self._world, nbytes, "MemoryWriter"
        )
        with buffer as (writer, done), _torchfile.no_crc32():
            _write_files_from_queue(
                create_stream=lambda path, mode: _Stream(writer),
                file_queue=files,
                result_queue=results,
                planner=planner,
                transforms=self.transforms,
                inflight_threshhold=self.per_thread_copy_ahead,
                use_fsync=False,
                thread_count=1,
                serialization_format=self.serialization_format,
            )
        if not done[0]:  # the next save's buffer, prepared while training goes on
            _worker.prepare_next(self._root, self._rank, writer.pos)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results.get_nowait())
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never chosen for a checkpoint_id: pass it as storage_writer


class _MemoryReader(_ReaderBase):
    """Load the DCP checkpoint the node's agent resumes this worker from::

        reader = MemoryReader()
        if reader.step is not None:
            dcp.load(state_dict, storage_reader=reader)
            start = reader.step

    ``step``: the newest step every rank of the world that saved it completed (with its
    DCP metadata), in the agent's memory or in ``--checkpoint-dir``; None when there is
    none (or outside ``aelastic run``). A job of another world size than the one that
    saved it loads it resharded (DCP's load plans).

    Raises:
        CheckpointError: the step to resume has no DCP metadata on this node (see
            :func:`_choose`); from ``read_metadata`` (through ``dcp.load``) when ``step``
            is None.
    """

    def __init__(self) -> None:
        self.step, path = _choose()
        super().__init__(path or os.devnull)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.step is None:
            raise CheckpointError(
                "aelastic.checkpoint.MemoryReader: there is no checkpoint to load "
                "(reader.step is None): start from scratch"
            )
        return super().read_metadata(*args, **kwargs)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


if TYPE_CHECKING:
    MemoryWriter = _MemoryWriter
    MemoryReader = _MemoryReader
else:

    def __getattr__(name: str) -> type:
        """``MemoryWriter``/``MemoryReader``: built at first lookup on torch's classes."""
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            from torch.distributed.checkpoint import filesystem
        except ImportError as exc:
            raise CheckpointError(
                f"aelastic.checkpoint.{name} needs torch ({exc}); install torch in the "
                "workers' environment (torch.distributed.checkpoint is part of it)"
            ) from None
        for public, body, base in (
            ("MemoryWriter", _MemoryWriter, filesystem.FileSystemWriter),
            ("MemoryReader", _MemoryReader, filesystem.FileSystemReader),
        ):
            built = type(public, (body, base), {"__doc__": body.__doc__, "__module__": __name__})
            built.__qualname__ = public
            globals()[public] = built
        return globals()[name]


def _choose() -> tuple[int | None, str | None]:
    """(step, its directory) for :class:`MemoryReader`: the step the agent chose, where
    its DCP metadata is (memory, then ``--checkpoint-dir``). If it has none there: the
    newest older step that has it and every rank's file (the coordinator writes the
    metadata last, so a crash right after every rank's data leaves a step without it).

    Raises:
        CheckpointError: the agent chose a step, and neither it nor an older whole step
            has DCP metadata on this node (answering None instead would let this rank
            start over while the others resume).
    """
    raw = os.environ.get(L.STEP_ENV, "")
    if not raw:
        return None, None
    chosen = int(raw)
    roots = [r for r in (os.environ.get(L.DIR_ENV), os.environ.get(L.PERSIST_DIR_ENV)) if r]
    for root in roots:  # the first root with the metadata and every rank's file
        whole = L.complete_steps(L.scan(root), (), whole_world=True)
        if chosen in whole and os.path.exists(os.path.join(L.step_dir(root, chosen), L.METADATA)):
            return chosen, L.step_dir(root, chosen)
    best: tuple[int, str] | None = None
    for root in roots:
        whole = L.complete_steps(L.scan(root), (), whole_world=True)
        for step in sorted((s for s in whole if s < chosen), reverse=True):
            path = L.step_dir(root, step)
            if os.path.exists(os.path.join(path, L.METADATA)):
                if best is None or step > best[0]:
                    best = (step, path)
                break
    if best is None:
        raise CheckpointError(
            f"aelastic.checkpoint.MemoryReader: step {chosen}, the one to resume from, has "
            "no torch.distributed.checkpoint metadata on this node: it was saved with "
            "checkpoint.save() (read it with checkpoint.load()), or its .metadata, written on "
            "the node of DCP's coordinator (rank 0), did not reach this one: --checkpoint-"
            "peer-copies carry it, or give the nodes a shared --checkpoint-dir"
        )
    return best
