"""The agents of a round agree on ranks and on the workers' store through the store."""

from __future__ import annotations

import anyio
import pytest

from aelastic.agent import WorkerSpec
from aelastic.agent._rank_exchange import exchange_ranks
from aelastic.agent._ranks import RankAssignment
from aelastic.store import LocalStore

from ._shared import LocalRendezvous


@pytest.mark.parametrize("identical", [False, True])
async def test_three_agents_agree_on_ranks_and_the_endpoint(
    identical: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if identical:
        monkeypatch.setenv("TORCH_ELASTIC_WORKER_IDENTICAL", "1")
    else:
        monkeypatch.delenv("TORCH_ELASTIC_WORKER_IDENTICAL", raising=False)
    store = LocalStore()
    spec = WorkerSpec(
        role="trainer", local_world_size=2, rdzv_handler=LocalRendezvous(), entrypoint="x"
    )
    asked: list[int] = []
    got: dict[int, tuple[RankAssignment, str, int, bool]] = {}

    async def endpoint() -> tuple[str, int, bool]:
        asked.append(1)
        return "host0", 29500, True

    async def agent(group_rank: int) -> None:
        got[group_rank] = await exchange_ranks(store, group_rank, 3, spec, endpoint)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for rank in (2, 1, 0):
                tg.start_soon(agent, rank)
    assert asked == [1]  # only group rank 0 decides the endpoint
    for rank, (mine, addr, port, agent_store) in got.items():
        assert (addr, port, agent_store) == ("host0", 29500, True)
        assert mine.base_global_rank == 2 * rank and mine.world_size == 6
