"""Checkpoints in memory the node's agent owns: they survive worker restarts, reach disk
in the background.

In a worker (``python -m aelastic run ...``)::

    from aelastic import checkpoint

    resumed = checkpoint.load()             # (step, obj) or None
    start = 0
    if resumed is not None:
        start, state = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    for step in range(start, steps):
        ...
        checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                        step=step + 1)

``save`` blocks for one copy of the tensors' bytes into shared memory the agent owns (a
buffer per rank, reused from step to step; ``save(..., asynchronous=True)`` returns
before CUDA tensors reach it, see docs/checkpoint-fast-save.md);
``load`` returns the newest step that every rank completed. With ``--checkpoint-dir``
the agent also writes the newest step to disk (every ``--checkpoint-persist-interval``
seconds and before it exits) and a fresh launch resumes from there. With several nodes,
each agent copies its ranks' newest step to the next ``--checkpoint-peer-copies`` nodes
(default 1), and a node that replaces a lost one resumes its ranks from such a copy.

With ``torch.distributed.checkpoint`` (sharded states, resharding on load)::

    reader = checkpoint.MemoryReader()      # reader.step: None, or the step to resume
    if reader.step is not None:
        dcp.load(state_dict, storage_reader=reader)
    ...
    dcp.save(state_dict, storage_writer=checkpoint.MemoryWriter(step=step + 1))

Importing this package imports neither torch nor anyio, nor the worker's save path:
every name but ``CheckpointError`` loads on first use (``LaunchConfig`` imports the
package for its settings, and an agent never saves; the agent's side,
``_agent.open_checkpoints``, is private); :func:`save` and :func:`load` import torch
when first called.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._exceptions import CheckpointError as CheckpointError

if TYPE_CHECKING:
    from ._dcp import MemoryReader as MemoryReader
    from ._dcp import MemoryWriter as MemoryWriter
    from ._timed import load as load
    from ._timed import save as save
    from ._worker import reserve as reserve
    from ._worker import wait as wait

__all__ = (
    "CheckpointError",
    "MemoryReader",
    "MemoryWriter",
    "load",
    "reserve",
    "save",
    "wait",
)


def _read_job_secret(path: str) -> bytes:
    """``--job-secret-file``'s key (the launcher checks it, the agent reads it). Raises
    ValueError naming the problem and the fix."""
    from ._peerauth import read_key_file

    return read_key_file(path)


__getattr__, __dir__ = lazy_exports(__name__, globals())
