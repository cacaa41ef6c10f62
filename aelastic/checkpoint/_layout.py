"""Where checkpoints live and how their files are named: shared by workers and the agent.

Standard library only (the agent imports this; it must never import torch). One
directory holds the steps, in memory (the agent's directory under ``/dev/shm``) and on
disk (``--checkpoint-dir``) alike::

    step_000000000040/rank_0_of_2.pt     # torch.save of rank 0's object at step 40
    step_000000000040/rank_1_of_2.pt
    manifest.json                        # on disk only: the newest step written there

A step saved through ``torch.distributed.checkpoint`` (``MemoryWriter``) has DCP data in
its rank files and DCP's ``.metadata`` beside them (written by the coordinator once
every rank wrote): the directory is a DCP checkpoint as ``FileSystemReader`` reads it.

A rank file appears by ``rename`` of a temporary file (``.rank_0_of_2.pt.<pid>.tmp``)
once its bytes are complete, so a file with the final name is always whole: a save
interrupted by a crash leaves only a temporary file behind, which no reader looks at.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Container, Iterable, Mapping

from .._dataclass import dataclass

__all__ = (
    "DIR_ENV",
    "METADATA",
    "PERSIST_DIR_ENV",
    "STEP_ENV",
    "WORLD_ENV",
    "Step",
    "complete_steps",
    "prune",
    "rank_file",
    "remove_ranks",
    "scan",
    "source_rank",
    "step_dir",
    "step_of",
)

#: The agent's in-memory checkpoint directory (set in every worker's environment).
DIR_ENV = "AELASTIC_CHECKPOINT_DIR"
#: ``--checkpoint-dir``, when set: the workers read a step the agent found only there.
PERSIST_DIR_ENV = "AELASTIC_CHECKPOINT_PERSIST_DIR"
#: The step :func:`aelastic.checkpoint.load` returns ("" or unset: none), decided by the
#: agent when it started the workers: complete for every rank of the world that saved it.
STEP_ENV = "AELASTIC_CHECKPOINT_STEP"
#: The world size that saved that step.
WORLD_ENV = "AELASTIC_CHECKPOINT_WORLD_SIZE"

#: DCP's metadata file in a step directory (``torch.distributed.checkpoint`` steps only).
METADATA = ".metadata"

_STEP_RE = re.compile(r"^step_(\d+)$")
_RANK_RE = re.compile(r"^rank_(\d+)_of_(\d+)\.pt$")


def source_rank(rank: int, world: int) -> int:
    """The rank of a step saved by a world of ``world`` ranks whose file global ``rank``
    reads: its own when that world had it, else ``rank % world`` (a job that grew:
    data-parallel state is the same on every rank)."""
    return rank if rank < world else rank % world


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:012d}")


def rank_file(root: str, step: int, rank: int, world_size: int) -> str:
    return os.path.join(step_dir(root, step), f"rank_{rank}_of_{world_size}.pt")


def step_of(path: str) -> int:
    """The step of a path :func:`rank_file` made. Raises ValueError for another path."""
    m = _STEP_RE.match(os.path.basename(os.path.dirname(path)))
    if m is None:
        raise ValueError(f"not a rank file of a step: {path!r}")
    return int(m[1])


@dataclass(frozen=True)
class Step:
    """The committed rank files of one step in one directory."""

    step: int
    #: ``{world_size: {rank: size in bytes}}`` (one world size, unless a job of another
    #: size saved the same step number into the same directory).
    ranks: Mapping[int, Mapping[int, int]]

    def holds_any(self, ranks: Container[int]) -> bool:
        return any(r in ranks for files in self.ranks.values() for r in files)


def scan(root: str) -> dict[int, Step]:
    """The committed steps in ``root`` by step number (``{}`` if it does not exist).

    Lists one directory per step and stats each rank file: bounded by the steps kept
    (two per rank in memory). Files vanishing while it reads are skipped.
    """
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    steps: dict[int, Step] = {}
    for name in names:
        m = _STEP_RE.match(name)
        if m is None:
            continue
        path = os.path.join(root, name)
        ranks: dict[int, dict[int, int]] = {}
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            f = _RANK_RE.match(entry.name)
            if f is None:
                continue
            try:
                size = entry.stat().st_size
            except FileNotFoundError:
                continue
            ranks.setdefault(int(f.group(2)), {})[int(f.group(1))] = size
        if ranks:
            steps[int(m.group(1))] = Step(int(m.group(1)), ranks)
    return steps


def complete_steps(
    steps: Mapping[int, Step], ranks: Iterable[int], *, whole_world: bool = False
) -> dict[int, int]:
    """``{step: world_size}`` of the steps holding a file for every one of ``ranks``.

    ``whole_world``: the step must hold every rank ``0..world_size-1`` of the world
    that saved it (``ranks`` is then ignored).
    """
    wanted = list(ranks)
    out: dict[int, int] = {}
    for number, step in steps.items():
        for world in sorted(step.ranks, reverse=True):
            need = range(world) if whole_world else wanted
            if set(need) <= step.ranks[world].keys():
                out[number] = world
                break
    return out


def remove_ranks(root: str, step: Step, ranks: Container[int] | None = None) -> None:
    """Delete ``ranks``' files of ``step`` (None: all) and its directory once empty."""
    for world, files in step.ranks.items():
        for rank in files:
            if ranks is None or rank in ranks:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(rank_file(root, step.step, rank, world))
    remove_if_done(step_dir(root, step.step))


def remove_if_done(directory: str) -> None:
    """Remove a step's ``directory`` once no rank's file is left in it (its DCP metadata,
    if any, goes with it; an interrupted save's temporary file keeps it)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    if names == [METADATA]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, METADATA))
    with contextlib.suppress(OSError):  # other ranks' files are still there
        os.rmdir(directory)


def prune(root: str, ranks: Container[int], keep: int = 2) -> None:
    """Keep ``ranks``' files of their ``keep`` newest steps in ``root``; delete the older."""
    held = sorted(
        (s for s in scan(root).values() if s.holds_any(ranks)), key=lambda s: s.step, reverse=True
    )
    for old in held[keep:]:
        remove_ranks(root, old, ranks)
