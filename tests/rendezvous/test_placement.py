"""Group-rank placement (``_placement``): sticky ranks, ``--node-rank-order``, the lead.

The plain decision first, then c10d handlers over real TCP (an in-process store
server), joined one at a time in a chosen order so join order differs from the ranks
that must be kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack

import anyio
import pytest

from aelastic.rendezvous import RendezvousStateError
from aelastic.rendezvous._c10d import C10dRendezvousHandler
from aelastic.rendezvous._exceptions import RendezvousConfigError
from aelastic.rendezvous._placement import Seat, check_rank_order, place, rank_key
from aelastic.rendezvous._state import Tick
from aelastic.store import StoreServer

from .test_c10d import c10d


def test_same_members_keep_their_ranks_whatever_the_join_order() -> None:
    # seats in join order; each was admitted with rank 3, 1, 0, 2 in round (0, 7)
    seats = [Seat(last=(0, 7, r)) for r in (3, 1, 0, 2)]
    assert place(seats) == [2, 1, 3, 0]


def test_a_newcomer_takes_the_freed_rank_and_the_others_keep_theirs() -> None:
    # rank 1 left; the newcomer joined first
    seats = [Seat(), Seat(last=(0, 7, 2)), Seat(last=(0, 7, 0)), Seat(last=(0, 7, 3))]
    assert place(seats) == [2, 0, 1, 3]


def test_a_shrunk_world_closes_the_hole_keeping_the_survivors_order() -> None:
    seats = [Seat(last=(0, 7, 3)), Seat(last=(0, 7, 0)), Seat(last=(0, 7, 2))]
    assert place(seats) == [1, 2, 0]  # ranks 0, 2, 3 -> 0, 1, 2


def test_claims_from_an_older_round_count_as_newcomers() -> None:
    # seat 0 sat out round 7 (excluded): its rank of round 5 no longer holds
    seats = [Seat(last=(0, 5, 0)), Seat(last=(0, 7, 0)), Seat(last=(0, 7, 1)), Seat()]
    assert place(seats) == [1, 2, 0, 3]
    # a re-hosted store (epoch 1) starts its rounds at 0 again and is still newer
    assert place([Seat(last=(0, 9, 0)), Seat(last=(1, 0, 0))]) == [1, 0]


def test_topology_key_groups_ranks_with_the_lead_group_first() -> None:
    racks = ["b", "a", "c", "a", "b", None]
    seats = [Seat(key=k) for k in racks]
    assert [racks[i] for i in place(seats)] == ["a", "a", "b", "b", "c", None]
    # the lead (index 4, rack b) gets rank 0 and its rack stays in one piece
    assert place(seats, lead=4) == [4, 0, 1, 3, 2, 5]


def test_ties_of_a_key_keep_the_last_ranks() -> None:
    seats = [Seat("a", (0, 1, 1)), Seat("a", (0, 1, 0)), Seat("b", (0, 1, 2))]
    assert place(seats) == [1, 0, 2]


def test_a_rank_order_tick_round_trips_and_is_checked() -> None:
    tick = Tick(3, "running", upto=5, world=4, removed=(2,), order=(4, 0, 3, 1))
    assert Tick.loads("k", tick.dumps().encode()) == tick
    assert [tick.rank_of(t) for t in (4, 0, 3, 1)] == [0, 1, 2, 3]
    assert '"order"' not in Tick(1, "running", upto=2, world=2).dumps()
    bad = Tick(3, "running", upto=5, world=4, removed=(2,), order=(4, 0, 2, 1))
    with pytest.raises(RendezvousStateError, match="not the round's members"):
        Tick.loads("k", bad.dumps().encode())


def test_rank_order_forms_and_their_errors() -> None:
    assert check_rank_order(" env:RACK ") == "env:RACK"
    assert rank_key("hostname", "h1", {}) == "h1"
    assert rank_key("env:RACK", "h1", {"RACK": "r7"}) == "r7"
    with pytest.raises(RendezvousConfigError, match="unknown key; pass 'hostname' or 'env:VAR'"):
        check_rank_order("rack")
    with pytest.raises(RendezvousConfigError, match="RACK is unset or empty on this node; set"):
        rank_key("env:RACK", "h1", {"RACK": " "})


async def _join_in_order(
    hs: Sequence[C10dRendezvousHandler], local: object, round_: int
) -> dict[int, int]:
    """Join ``hs`` one after the other (ticket k is taken before hs[k+1] starts, seen in
    the store); return each handler's rank by its index in ``hs``."""
    from aelastic.store import Store

    assert isinstance(local, Store)
    ranks: dict[int, int] = {}

    async def one(i: int) -> None:
        ranks[i] = (await hs[i].next_rendezvous()).rank

    async with anyio.create_task_group() as tg:
        for i in range(len(hs)):
            tg.start_soon(one, i)
            base = f"rdzv/job/c/{round_}"
            await local.wait([f"{base}/tick" if i == 0 else f"{base}/node/{i}"])
    return ranks


async def test_ranks_survive_a_restart_and_a_replaced_node(store_server: StoreServer) -> None:
    endpoint = f"127.0.0.1:{store_server.port}"
    local = store_server.local_store
    async with AsyncExitStack() as stack:

        async def handler() -> C10dRendezvousHandler:
            return await stack.enter_async_context(c10d(endpoint, 4, 4, is_host="false"))

        a, b, c, d = [await handler() for _ in range(4)]
        with anyio.fail_after(20):
            first = await _join_in_order([a, b, c, d], local, 0)
        assert first == {0: 0, 1: 1, 2: 2, 3: 3}
        with anyio.fail_after(20):  # a restart: everyone rejoins, in reverse order
            again = await _join_in_order([d, c, b, a], local, 1)
        assert again == {0: 3, 1: 2, 2: 1, 3: 0}  # d, c, b, a keep 3, 2, 1, 0
        await b.shutdown()  # b leaves; a newcomer joins first and takes b's rank
        e = await handler()
        with anyio.fail_after(20):
            changed = await _join_in_order([e, d, a, c], local, 2)
        assert changed == {0: 1, 1: 3, 2: 0, 3: 2}


async def test_env_key_orders_ranks_and_the_store_host_group_comes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with AsyncExitStack() as stack:

        async def handler(rack: str, endpoint: str) -> C10dRendezvousHandler:
            monkeypatch.setenv("RACK", rack)  # read when the handler is built
            h = c10d(endpoint, 4, 4, node_rank_order="env:RACK")
            return await stack.enter_async_context(h)

        host = await handler("b", "127.0.0.1:0")  # hosts the store: rank 0
        assert host.server is not None
        endpoint = f"127.0.0.1:{host.server.port}"
        others = [await handler(rack, endpoint) for rack in ("a", "c", "b")]
        with anyio.fail_after(20):
            # the host joins last: it is no coordinator, its descriptor says it hosts
            ranks = await _join_in_order([*others, host], host.server.local_store, 0)
        # host (b) first with the other b, then a, then c
        assert ranks == {3: 0, 2: 1, 0: 2, 1: 3}
