"""A forming round whose previous round's members all rejoined closes without its last
call (``_rejoin``): the plain decision, then handlers on one in-process store."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from aelastic.rendezvous import RendezvousInfo
from aelastic.rendezvous._dynamic import DynamicRendezvousHandler
from aelastic.rendezvous._placement import Seat
from aelastic.rendezvous._rejoin import Previous, may_close_now, same_members, worth_checking
from aelastic.rendezvous._state import Tick
from aelastic.store import LocalStore, Store

from .test_dynamic import FAST

# This node was rank 1 of round 4 (epoch 0): 3 members, 3 tickets taken.
PREV = Previous(epoch=0, round=4, rank=1, world=3, upto=3)


def back(*ranks: int, round_: int = 4, epoch: int = 0) -> list[Seat | None]:
    return [Seat(last=(epoch, round_, r)) for r in ranks]


def test_the_previous_members_back_and_nobody_else_close_at_once() -> None:
    assert worth_checking(PREV, 0, 3)
    assert may_close_now(PREV, 0, back(2, 0), 3)
    # one member alone in a 1:N job
    assert may_close_now(Previous(0, 4, 0, 1, 1), 0, [], 1)


def test_a_first_round_or_another_epoch_waits_the_last_call() -> None:
    assert not worth_checking(None, 0, 2)
    assert not may_close_now(None, 0, back(0), 2)
    assert not worth_checking(PREV, 1, 3)  # the store was re-hosted since
    assert not may_close_now(PREV, 1, back(2, 0, epoch=1), 3)


def test_after_a_node_loss_the_survivors_wait_the_last_call() -> None:
    assert not worth_checking(PREV, 0, 2)
    assert not may_close_now(PREV, 0, back(2), 3)


def test_a_newcomer_or_a_node_of_another_round_waits_the_last_call() -> None:
    assert not may_close_now(PREV, 0, [Seat(), *back(0)], 3)  # no previous round
    assert not may_close_now(PREV, 0, [None, *back(0)], 3)  # no descriptor
    assert not may_close_now(PREV, 0, [*back(2), *back(0, round_=3)], 3)
    assert not may_close_now(PREV, 0, back(2, 1), 3)  # rank 1 twice: not the same members
    assert not may_close_now(PREV, 0, back(2, 5), 3)  # a rank the round did not have


def test_a_node_that_waited_in_the_previous_round_keeps_the_last_call() -> None:
    # a fourth ticket was taken in round 4 after it completed: that node comes too
    assert not may_close_now(PREV, 0, back(2, 0), 4)


def test_etcd_closes_at_once_only_for_exactly_the_previous_ids() -> None:
    assert same_members(["a", "b"], ["b", "a"])
    assert not same_members(["a", "b"], ["a"])  # a node lost
    assert not same_members(["a", "b"], ["a", "b", "c"])  # a newcomer or a waiting node
    assert not same_members(["a", "b"], ["a", "a"])


pytestmark = pytest.mark.anyio


def make(store: Store, last_call: float) -> DynamicRendezvousHandler:
    settings = dataclasses.replace(FAST, last_call_timeout=last_call)
    return DynamicRendezvousHandler("run", 2, 3, settings, store=store)


async def join_in_order(
    store: Store, round_: int, hs: list[DynamicRendezvousHandler]
) -> list[RendezvousInfo]:
    """Join ``hs`` to round ``round_`` in this order: ``hs[0]`` takes ticket 0 (the
    coordinator, whose last call is the one that counts)."""
    out: dict[int, RendezvousInfo] = {}

    async def one(i: int) -> None:
        out[i] = await hs[i].next_rendezvous()

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        await store.wait([f"rdzv/run/c/{round_}/joined"])
        for i in range(1, len(hs)):
            tg.start_soon(one, i)
    return [out[i] for i in range(len(hs))]


async def test_a_restarted_round_of_the_same_two_nodes_closes_at_once(
    rdzv_event_names: list[str],
) -> None:
    names = rdzv_event_names
    store = LocalStore()
    # a: a short last call, coordinates round 0; b: a last call longer than the test's
    # bound, coordinates round 1, which can only complete in time by closing at once.
    async with make(store, 0.2) as a, make(store, 600.0) as b:
        with anyio.fail_after(30):
            first = await join_in_order(store, 0, [a, b])
            assert names.count("last_call") == 1
            again = await join_in_order(store, 1, [b, a])
        assert [i.round for i in again] == [1, 1]
        assert [i.world_size for i in again] == [2, 2]
        assert [i.rank for i in again] == [first[1].rank, first[0].rank]  # ranks kept
        assert "rejoined" in names


async def test_survivors_of_a_node_loss_wait_the_last_call(
    rdzv_event_names: list[str],
) -> None:
    names = rdzv_event_names
    store = LocalStore()
    async with make(store, 600.0) as a, make(store, 600.0) as b, make(store, 600.0) as c:
        with anyio.fail_after(30):
            await join_in_order(store, 0, [a, b, c])  # max: no last call
            await c.shutdown()  # c is lost: a and b must not know it is not coming back
            async with anyio.create_task_group() as tg:
                tg.start_soon(b.next_rendezvous)
                await store.wait(["rdzv/run/c/1/joined"])
                tg.start_soon(a.next_rendezvous)
                # two ticks after the coordinator saw both tickets, the round still forms
                await store.wait(["rdzv/run/c/1/node/1"])  # registered after its ticket
                latest = "rdzv/run/c/1/tick"
                seen = Tick.loads(latest, await store.get(latest)).n
                while (tick := Tick.loads(latest, await store.get(latest))).n < seen + 3:
                    await store.wait([f"rdzv/run/c/1/tick/{tick.n + 1}"])
                assert tick.state == "joining"
                assert "last_call" in names and "rejoined" not in names
                tg.cancel_scope.cancel()
