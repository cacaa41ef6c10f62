"""Rank assignment across the agents of a round: the store exchange around
:func:`~aelastic.agent._ranks.assign_ranks` (torch's agent's algorithm), in O(1) requests per
agent.

Every agent but group rank 0 ``set``s its role info and ``get``s its assignment; group rank 0
``multi_get``s the others' infos and ``multi_set``s every assignment (which also carries the
workers' store endpoint). With ``TORCH_ELASTIC_WORKER_IDENTICAL=1`` ranks are computed
locally and only the endpoint crosses the store. The keys are torch's, so mixed tooling
reads the same ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Awaitable, Callable

from ..store import Store
from ._exceptions import AgentError
from ._ranks import RankAssignment, RoleInfo, assign_ranks, identical_assignment
from ._types import WorkerSpec

__all__ = ("exchange_ranks",)

_ROLE_INFO_PREFIX = "torchelastic/role_info"
_ASSIGNED_RANKS_PREFIX = "torchelastic/assigned_ranks"


async def exchange_ranks(
    store: Store,
    group_rank: int,
    group_world_size: int,
    spec: WorkerSpec,
    endpoint: Callable[[], Awaitable[tuple[str, int, bool]]],
) -> tuple[RankAssignment, str, int, bool]:
    """This agent's assignment and the workers' store ``(addr, port, use_agent_store)``.

    ``endpoint`` is awaited by group rank 0 only: it decides (and hosts) the workers' store.
    Store errors propagate; cancelling abandons the exchange (the caller re-rendezvouses).

    :raises AgentError: if group rank 0 published no endpoint.
    """
    identical = os.environ.get("TORCH_ELASTIC_WORKER_IDENTICAL") == "1"
    mine: RankAssignment
    addr: str | None
    port: int | None
    agent_store: bool
    if group_rank == 0:
        addr, port, agent_store = await endpoint()
        if identical:
            mine = identical_assignment(0, group_world_size, spec.local_world_size)
            if group_world_size > 1:
                await store.set(
                    f"{_ASSIGNED_RANKS_PREFIX}/endpoint",
                    json.dumps([addr, port, agent_store]),
                )
        else:
            infos = [RoleInfo(spec.role, 0, spec.local_world_size)]
            if group_world_size > 1:
                keys = [f"{_ROLE_INFO_PREFIX}/{r}" for r in range(1, group_world_size)]
                infos += [RoleInfo.deserialize(v) for v in await store.multi_get(keys)]
            answers = [
                dataclasses.replace(
                    a, master_addr=addr, master_port=port, use_agent_store=agent_store
                )
                for a in assign_ranks(infos)
            ]
            if group_world_size > 1:
                await store.multi_set(
                    [f"{_ASSIGNED_RANKS_PREFIX}/{r}" for r in range(1, group_world_size)],
                    [a.serialize() for a in answers[1:]],
                )
            mine = answers[0]
    elif identical:
        mine = identical_assignment(group_rank, group_world_size, spec.local_world_size)
        raw = await store.get(f"{_ASSIGNED_RANKS_PREFIX}/endpoint")
        addr, port, agent_store = json.loads(raw)
    else:
        info = RoleInfo(spec.role, group_rank, spec.local_world_size)
        await store.set(f"{_ROLE_INFO_PREFIX}/{group_rank}", info.serialize())
        mine = RankAssignment.deserialize(await store.get(f"{_ASSIGNED_RANKS_PREFIX}/{group_rank}"))
        addr, port, agent_store = mine.master_addr, mine.master_port, mine.use_agent_store
    if addr is None or port is None:
        raise AgentError("group rank 0 published no worker store endpoint")
    return mine, str(addr), int(port), bool(agent_store)
