"""Which step a round resumes from, and which files each node fetches for it: decisions.

Plain functions over what each node of the round publishes (:class:`Holdings`); the agent
(``_agent``) gathers the publications through the round's store and executes the result.
Every node computes the same answer from the same publications. Standard library only.

The rule (docs/checkpoints.md, "Resizing"):

* A worker of global rank ``r`` in the new world reads the file of rank
  :func:`~._layout.source_rank` ``(r, W)`` of the world ``W`` that saved the step: its own rank when
  that world had it (a job that shrinks, or keeps its size), else ``r mod W`` (a job that
  grows: data-parallel state is the same on every rank, so any rank's file will do; a
  state that differs per rank is read with ``load(rank=...)``).
* A step saved through ``torch.distributed.checkpoint`` (DCP: it has ``.metadata``) is
  read whole on every node (DCP's load plans reshard it, and may need any rank's file):
  each node needs every rank file of the step and its metadata, unless its
  ``--checkpoint-dir`` holds all of them. In a job that saves through DCP, a step without
  metadata (its coordinator died before writing it) is not resumed from.
* The round resumes from the newest step for which every node can read what its ranks
  need: from its own memory or ``--checkpoint-dir``, or by fetching the missing files
  from the memory of a node that serves peer copies (``--checkpoint-peer-copies`` > 0).
  A node with nothing does not veto the step: it fetches (a job that grows keeps its
  progress).
* What each node deletes then: :func:`to_delete`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._dataclass import dataclass
from . import _layout as L

__all__ = ("Holdings", "choose", "fetch_plan", "holdings", "lost", "missing", "to_delete")

#: ``{step: {world: ranks}}``
Held = Mapping[int, Mapping[int, frozenset[int]]]


@dataclass(frozen=True)
class Holdings:
    """What one node of a round holds, as it publishes it to the others."""

    #: the global ranks of its workers in this round
    ranks: tuple[int, ...]
    #: the committed rank files in its memory (what its listener can send)
    memory: Held
    #: the committed rank files in its ``--checkpoint-dir`` (readable by it alone, unless
    #: the directory is shared, in which case every node lists them)
    disk: Held
    #: the steps whose DCP ``.metadata`` is in its memory / its ``--checkpoint-dir``
    memory_metadata: frozenset[int] = frozenset()
    disk_metadata: frozenset[int] = frozenset()
    #: whether its listener serves peer copies (``--checkpoint-peer-copies`` > 0)
    serves: bool = False

    def worlds(self, step: int) -> set[int]:
        return set(self.memory.get(step, {})) | set(self.disk.get(step, {}))

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": _runs(self.ranks),
            "memory": _held_json(self.memory),
            "disk": _held_json(self.disk),
            "memory_metadata": sorted(self.memory_metadata),
            "disk_metadata": sorted(self.disk_metadata),
            "serves": self.serves,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Holdings:
        """Raises ValueError, KeyError or TypeError for what no agent published."""
        return cls(
            ranks=tuple(sorted(_unruns(raw["ranks"]))),
            memory=_held_parse(raw["memory"]),
            disk=_held_parse(raw["disk"]),
            memory_metadata=frozenset(int(s) for s in raw["memory_metadata"]),
            disk_metadata=frozenset(int(s) for s in raw["disk_metadata"]),
            serves=bool(raw["serves"]),
        )


def holdings(
    ranks: Sequence[int],
    memory: Mapping[int, L.Step],
    disk: Mapping[int, L.Step],
    memory_metadata: Iterable[int] = (),
    disk_metadata: Iterable[int] = (),
    serves: bool = False,
) -> Holdings:
    """A node's :class:`Holdings` from :func:`~._layout.scan` of its two directories."""
    return Holdings(
        ranks=tuple(ranks),
        memory=_held(memory),
        disk=_held(disk),
        memory_metadata=frozenset(memory_metadata),
        disk_metadata=frozenset(disk_metadata),
        serves=serves,
    )


def _held(steps: Mapping[int, L.Step]) -> dict[int, dict[int, frozenset[int]]]:
    return {
        number: {world: frozenset(files) for world, files in step.ranks.items()}
        for number, step in steps.items()
    }


def _is_dcp(nodes: Sequence[Holdings]) -> bool:
    return any(n.memory_metadata or n.disk_metadata for n in nodes)


def _has_metadata(nodes: Sequence[Holdings], step: int) -> bool:
    return any(step in n.memory_metadata or step in n.disk_metadata for n in nodes)


def missing(node: Holdings, step: int, world: int, dcp: bool) -> tuple[frozenset[int], bool]:
    """``(ranks, metadata)``: the rank files of ``step`` (saved by ``world``) that ``node``
    must fetch before its workers read it, and whether its DCP metadata too."""
    memory = node.memory.get(step, {}).get(world, frozenset())
    disk = node.disk.get(step, {}).get(world, frozenset())
    everyone = frozenset(range(world))
    if not dcp:
        needed = frozenset(L.source_rank(r, world) for r in node.ranks)
        return needed - memory - disk, False
    if step in node.disk_metadata and everyone <= disk:
        return frozenset(), False  # the reader reads the whole step from the disk
    return everyone - memory, step not in node.memory_metadata


def _servers(
    nodes: Sequence[Holdings], me: int, step: int, world: int
) -> dict[int, frozenset[int]]:
    """``{node: ranks}`` of ``step`` that the other nodes can send to node ``me``."""
    return {
        i: n.memory.get(step, {}).get(world, frozenset())
        for i, n in enumerate(nodes)
        if i != me and n.serves
    }


def fetch_plan(
    nodes: Sequence[Holdings], me: int, step: int, world: int
) -> dict[int, frozenset[int]] | None:
    """``{node: ranks}`` that node ``me`` fetches for ``step``; None when it cannot get
    all it needs. Fewest peers first: each next peer is the one that sends the most of
    what is still missing (ties: the lowest index). A fetch from a peer holding the
    step's DCP metadata brings it along (an empty set of ranks: the metadata alone)."""
    dcp = _is_dcp(nodes)
    ranks, metadata = missing(nodes[me], step, world, dcp)
    servers = _servers(nodes, me, step, world)
    plan: dict[int, frozenset[int]] = {}
    left = set(ranks)
    while left:
        best = max(servers, key=lambda i: (len(servers[i] & left), -i), default=None)
        if best is None or not servers[best] & left:
            return None
        plan[best] = frozenset(servers.pop(best) & left)
        left -= plan[best]
    if metadata and not any(step in nodes[i].memory_metadata for i in plan):
        holder = next((i for i in servers if step in nodes[i].memory_metadata), None)
        if holder is None:
            return None
        plan[holder] = frozenset()
    return plan


def choose(nodes: Sequence[Holdings]) -> tuple[int, int] | None:
    """``(step, world)`` the round resumes from: the newest step every node can read what
    its ranks need of (see the module's text); for a step saved by worlds of several
    sizes, the largest. None: no such step (the workers start from scratch)."""
    dcp = _is_dcp(nodes)
    pairs = {
        (step, world) for n in nodes for step in {*n.memory, *n.disk} for world in n.worlds(step)
    }
    for step, world in sorted(pairs, reverse=True):
        if dcp and not _has_metadata(nodes, step):
            continue
        if all(fetch_plan(nodes, i, step, world) is not None for i in range(len(nodes))):
            return step, world
    return None


def to_delete(held: Iterable[int], chosen: tuple[int, int] | None) -> list[int]:
    """The steps of ``held`` a node deletes from its memory once the round chose
    ``chosen``: the newer ones (every one, when none was chosen: the workers save these
    numbers again, and a round must never see old and new files as one step), and of
    the older ones all but the newest (a fallback: no round chooses the others again).

    A step newer than the chosen one cannot be kept for a later round in any case: the
    workers' saves reuse their rank's two newest files, whatever their step.
    """
    step = None if chosen is None else chosen[0]
    older = sorted((s for s in held if step is not None and s < step), reverse=True)
    return sorted(s for s in held if step is None or s > step or s in older[1:])


def lost(nodes: Sequence[Holdings], chosen: tuple[int, int] | None) -> int | None:
    """The newest step some node holds that is newer than ``chosen``'s: progress the
    round gives up (for the warning that names the fix), or None."""
    newest = max((s for n in nodes for s in {*n.memory, *n.disk}), default=None)
    if newest is None or (chosen is not None and newest <= chosen[0]):
        return None
    return newest


# -- compact JSON: ranks as runs ([[first, last], ...]), steps and worlds as strings -------


def _runs(ranks: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def _unruns(runs: Any) -> frozenset[int]:
    out: set[int] = set()
    for first, last in runs:
        first, last = int(first), int(last)
        if not 0 <= first <= last or last - first > 1 << 20:
            raise ValueError(f"not a run of ranks: {first}..{last}")
        out.update(range(first, last + 1))
    return frozenset(out)


def _held_json(held: Held) -> dict[str, dict[str, list[list[int]]]]:
    return {
        str(step): {str(world): _runs(ranks) for world, ranks in worlds.items()}
        for step, worlds in held.items()
    }


def _held_parse(raw: Any) -> dict[int, dict[int, frozenset[int]]]:
    out: dict[int, dict[int, frozenset[int]]] = {}
    for step, worlds in raw.items():
        if int(step) < 0:
            raise ValueError(f"a negative step: {step}")
        out[int(step)] = {int(world): _unruns(runs) for world, runs in worlds.items()}
    return out
