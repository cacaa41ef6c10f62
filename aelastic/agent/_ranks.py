"""Rank assignment: torch's agent's algorithm (roles, per-node local world sizes), pure part.

Each agent publishes a :class:`RoleInfo`; the group-rank-0 agent computes every
node's :class:`RankAssignment` with :func:`assign_ranks` and publishes them in one
request; the others read their own. Global ranks follow group-rank order; role ranks
follow group-rank order among the nodes of the same role.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .._dataclass import dataclass
from ._exceptions import AgentError

__all__ = ("RankAssignment", "RoleInfo", "assign_ranks", "identical_assignment")


@dataclass(frozen=True)
class RoleInfo:
    """What one agent tells the others: its role, group rank and local world size."""

    role: str
    rank: int
    local_world_size: int

    def serialize(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @staticmethod
    def deserialize(data: bytes) -> RoleInfo:
        try:
            obj = json.loads(data)
            return RoleInfo(str(obj["role"]), int(obj["rank"]), int(obj["local_world_size"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentError(f"malformed role info in the rendezvous store: {data!r}") from exc


@dataclass(frozen=True)
class RankAssignment:
    """One node's ranks: worker ``i`` gets ``base_global_rank + i``, ``base_role_rank + i``.

    ``master_addr``/``master_port``/``use_agent_store``: the workers' store endpoint
    decided by group rank 0 (carried in the same message, so no extra store request).
    """

    base_global_rank: int
    world_size: int
    base_role_rank: int
    role_world_size: int
    master_addr: str | None = None
    master_port: int | None = None
    use_agent_store: bool = True

    def serialize(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @staticmethod
    def deserialize(data: bytes) -> RankAssignment:
        try:
            obj: dict[str, Any] = json.loads(data)
            port = obj.get("master_port")
            return RankAssignment(
                int(obj["base_global_rank"]),
                int(obj["world_size"]),
                int(obj["base_role_rank"]),
                int(obj["role_world_size"]),
                obj.get("master_addr"),
                None if port is None else int(port),
                bool(obj.get("use_agent_store", True)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentError(
                f"malformed rank assignment in the rendezvous store: {data!r}"
            ) from exc


def assign_ranks(infos: Sequence[RoleInfo]) -> list[RankAssignment]:
    """Return every node's assignment, indexed by group rank.

    ``infos[i]`` must be group rank ``i``'s info. Global ranks: the offset of node
    ``i`` is the sum of the local world sizes of nodes ``< i``. Role ranks: the same
    sum over the nodes ``< i`` that share node ``i``'s role.
    """
    for index, info in enumerate(infos):
        if info.rank != index:
            raise AgentError(
                f"role info #{index} claims group rank {info.rank}: the rendezvous gave two"
                " nodes the same rank or the store holds another round's keys"
            )
        if info.local_world_size <= 0:
            raise AgentError(f"node {index} reported local_world_size={info.local_world_size}")
    world_size = sum(info.local_world_size for info in infos)
    role_sizes: dict[str, int] = {}
    for info in infos:
        role_sizes[info.role] = role_sizes.get(info.role, 0) + info.local_world_size
    role_offsets: dict[str, int] = {}
    out = []
    base = 0
    for info in infos:
        role_base = role_offsets.get(info.role, 0)
        out.append(RankAssignment(base, world_size, role_base, role_sizes[info.role]))
        role_offsets[info.role] = role_base + info.local_world_size
        base += info.local_world_size
    return out


def identical_assignment(
    group_rank: int, group_world_size: int, local_world_size: int
) -> RankAssignment:
    """The ``TORCH_ELASTIC_WORKER_IDENTICAL=1`` fast path: every node alike, one role."""
    world_size = group_world_size * local_world_size
    base = group_rank * local_world_size
    return RankAssignment(base, world_size, base, world_size)
