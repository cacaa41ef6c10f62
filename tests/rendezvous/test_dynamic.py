"""The dynamic rendezvous algorithm: many handlers in one event loop on one in-process store."""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from aelastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from aelastic.rendezvous._dynamic import DynamicRendezvousHandler
from aelastic.rendezvous._settings import DynamicSettings
from aelastic.store import LocalStore, Store

pytestmark = pytest.mark.anyio

FAST = DynamicSettings(
    join_timeout=10.0,
    last_call_timeout=0.3,
    close_timeout=5.0,
    keep_alive_interval=0.05,
    keep_alive_max_attempt=4,
    heartbeat_timeout=0.2,
    read_timeout=5.0,
)


def make(store: Store, min_nodes: int, max_nodes: int, **kw: float) -> DynamicRendezvousHandler:
    settings = dataclasses.replace(FAST, **kw)  # type: ignore[arg-type]
    return DynamicRendezvousHandler("run", min_nodes, max_nodes, settings, store=store)


@asynccontextmanager
async def handlers(
    store: Store, n: int, min_nodes: int, max_nodes: int, **kw: float
) -> AsyncIterator[list[DynamicRendezvousHandler]]:
    async with AsyncExitStack() as stack:
        hs = [make(store, min_nodes, max_nodes, **kw) for _ in range(n)]
        for h in hs:
            await stack.enter_async_context(h)
        yield hs


async def rendezvous_all(hs: list[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    out: list[RendezvousInfo | None] = [None] * len(hs)

    async def one(i: int) -> None:
        out[i] = await hs[i].next_rendezvous()

    async with anyio.create_task_group() as tg:
        for i in range(len(hs)):
            tg.start_soon(one, i)
    return [o for o in out if o is not None]


async def test_fixed_world_ranks_in_join_order() -> None:
    store = LocalStore()
    async with handlers(store, 5, 5, 5, last_call_timeout=30.0) as hs:
        with anyio.fail_after(5):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == list(range(5))
        assert {i.world_size for i in infos} == {5}
        assert {i.round for i in infos} == {0}
        store_, rank, world = infos[0]
        assert (rank, world) == (infos[0].rank, 5)
        # The agent store is namespaced by run and round.
        await store_.set("k", "v")
        assert await store.get("rdzv/run/0/k") == b"v"
        assert [await h.num_nodes_waiting() for h in hs] == [0] * 5


async def test_last_call_completes_with_min_after_timeout() -> None:
    store = LocalStore()
    async with handlers(store, 2, 2, 4, last_call_timeout=0.3) as hs:
        with anyio.fail_after(5):
            start = anyio.current_time()
            infos = await rendezvous_all(hs)
            assert anyio.current_time() - start >= 0.3
        assert sorted((i.rank, i.world_size) for i in infos) == [(0, 2), (1, 2)]


async def test_max_nodes_completes_without_waiting_for_last_call() -> None:
    store = LocalStore()
    async with handlers(store, 3, 1, 3, last_call_timeout=60.0) as hs:
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == [0, 1, 2]


async def test_join_timeout_names_the_fix() -> None:
    store = LocalStore()
    async with handlers(store, 1, 2, 2, join_timeout=0.3) as (h,):
        with anyio.fail_after(5), pytest.raises(RendezvousTimeoutError, match="join_timeout"):
            await h.next_rendezvous()
    # A later node is not blocked by the timed-out one's round.
    async with handlers(store, 2, 2, 2) as hs:
        with anyio.fail_after(5):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == [0, 1]


async def test_late_joiner_is_counted_then_admitted_next_round() -> None:
    store = LocalStore()
    async with handlers(store, 3, 2, 3, last_call_timeout=0.1) as hs:
        with anyio.fail_after(5):
            first = await rendezvous_all(hs[:2])
        assert {i.round for i in first} == {0}
        async with anyio.create_task_group() as tg:
            late: list[RendezvousInfo] = []

            async def join_late() -> None:
                late.append(await hs[2].next_rendezvous())

            tg.start_soon(join_late)
            with anyio.fail_after(5):
                await hs[0].wait_for_membership_change()
                await hs[1].wait_for_membership_change()
            assert await hs[0].num_nodes_waiting() == 1
            with anyio.fail_after(5):
                again = await rendezvous_all(hs[:2])
        infos = [*again, *late]
        assert {i.round for i in infos} == {1}
        assert sorted(i.rank for i in infos) == [0, 1, 2]
        assert {i.world_size for i in infos} == {3}


async def test_spare_waits_uncounted_and_replaces_a_leaver() -> None:
    store = LocalStore()
    async with handlers(store, 3, 2, 2) as hs:
        with anyio.fail_after(5):
            first = await rendezvous_all(hs[:2])
        assert sorted(i.rank for i in first) == [0, 1]
        async with anyio.create_task_group() as tg:
            got: list[RendezvousInfo] = []

            async def spare() -> None:
                got.append(await hs[2].next_rendezvous())

            tg.start_soon(spare)
            # The spare registers but does not count as waiting: the world is full.
            with anyio.fail_after(5):
                await store.wait(["rdzv/run/c/0/node/2"])
            assert await hs[0].num_nodes_waiting() == 0
            # A participant leaves: the others see the change and re-rendezvous with the spare.
            await hs[1].shutdown()
            with anyio.fail_after(5):
                await hs[0].wait_for_membership_change()
                again = await hs[0].next_rendezvous()
        assert (again.round, again.world_size) == (1, 2)
        assert got[0].round == 1
        assert sorted([again.rank, got[0].rank]) == [0, 1]


async def test_close_fails_pending_and_later_joins() -> None:
    store = LocalStore()
    async with handlers(store, 3, 3, 3) as hs:
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def pending() -> None:
                try:
                    await hs[0].next_rendezvous()
                except RendezvousClosedError as exc:
                    errors.append(exc)

            tg.start_soon(pending)
            with anyio.fail_after(5):
                await store.wait(["rdzv/run/c/0/tick"])
                await hs[1].set_closed()
        assert len(errors) == 1
        assert await hs[2].is_closed()
        with anyio.fail_after(5), pytest.raises(RendezvousClosedError):
            await hs[2].next_rendezvous()


async def test_lapsed_member_after_completion_wakes_the_others() -> None:
    store = LocalStore()
    async with handlers(store, 3, 2, 3, last_call_timeout=0.1) as hs:
        with anyio.fail_after(5):
            await rendezvous_all(hs)
        # Freeze one member (its heartbeats stop, as if the machine hung).
        frozen = next(h for h in hs if h._view is not None and h._view.ticket != 0)
        assert frozen._view is not None and frozen._view.scope is not None
        frozen._view.scope.cancel()
        others = [h for h in hs if h is not frozen]
        with anyio.fail_after(5):
            for h in others:
                await h.wait_for_membership_change()
            infos = await rendezvous_all(others)
        assert sorted(i.rank for i in infos) == [0, 1]
        assert {i.round for i in infos} == {1}


async def test_coordinator_loss_wakes_members_and_next_round_forms() -> None:
    store = LocalStore()
    async with handlers(store, 3, 2, 3, last_call_timeout=0.1) as hs:
        with anyio.fail_after(5):
            await rendezvous_all(hs)
        coordinator = next(h for h in hs if h._view is not None and h._view.ticket == 0)
        assert coordinator._view is not None and coordinator._view.scope is not None
        coordinator._view.scope.cancel()  # the coordinator stops ticking
        others = [h for h in hs if h is not coordinator]
        with anyio.fail_after(5):
            for h in others:
                await h.wait_for_membership_change()
            infos = await rendezvous_all(others)
        assert sorted(i.rank for i in infos) == [0, 1]


async def test_malformed_tick_raises_state_error_naming_the_key() -> None:
    store = LocalStore()
    await store.add("rdzv/run/c/0/joined", 1)  # someone else holds ticket 0
    await store.set("rdzv/run/c/0/tick", "{not json")
    async with handlers(store, 1, 2, 2) as (h,):
        with anyio.fail_after(5), pytest.raises(RendezvousStateError, match="rdzv/run/c/0/tick"):
            await h.next_rendezvous()


async def test_malformed_round_counter_raises_state_error() -> None:
    store = LocalStore()
    await store.set("rdzv/run/c/round", "seven")
    async with handlers(store, 1, 1, 1) as (h,):
        with anyio.fail_after(5), pytest.raises(RendezvousStateError, match="round"):
            await h.next_rendezvous()


async def test_malformed_inbox_message_reaches_the_coordinator_as_state_error() -> None:
    store = LocalStore()
    async with handlers(store, 1, 1, 1) as (h,):
        with anyio.fail_after(5):
            await h.next_rendezvous()
            await store.queue_push("rdzv/run/c/0/inbox", '{"op": "explode"}')
            with pytest.raises(RendezvousStateError, match="explode"):
                await h.wait_for_membership_change()


async def test_handler_must_be_entered() -> None:
    h = make(LocalStore(), 1, 1)
    with pytest.raises(Exception, match="async with"):
        await h.next_rendezvous()


async def test_cancelled_join_withdraws_the_node() -> None:
    store = LocalStore()
    async with handlers(store, 4, 3, 3) as (a, b, c, d):
        async with anyio.create_task_group() as tg:
            got: list[RendezvousInfo] = []
            tg.start_soon(join_into, got, a)
            with anyio.fail_after(5):
                await store.wait(["rdzv/run/c/0/tick"])
                scope, withdrawn = anyio.CancelScope(), anyio.Event()
                tg.start_soon(join_then_cancel, b, scope, withdrawn)
                await store.wait(["rdzv/run/c/0/node/1"])
                scope.cancel()
                await withdrawn.wait()
                tg.start_soon(join_into, got, c)
                tg.start_soon(join_into, got, d)
        # b withdrew: a, c and d form the world without it, ranks in join order.
        assert sorted((i.rank, i.world_size, i.round) for i in got) == [
            (0, 3, 0),
            (1, 3, 0),
            (2, 3, 0),
        ]


async def join_into(got: list[RendezvousInfo], h: DynamicRendezvousHandler) -> None:
    got.append(await h.next_rendezvous())


async def join_then_cancel(
    h: DynamicRendezvousHandler, scope: anyio.CancelScope, done: anyio.Event
) -> None:
    with scope:
        await h.next_rendezvous()
        raise AssertionError("not cancelled")  # pragma: no cover
    done.set()


async def test_cancelled_coordinator_hands_the_round_over() -> None:
    store = LocalStore()
    async with handlers(store, 3, 3, 3) as (a, b, c):
        async with anyio.create_task_group() as tg:
            got: list[RendezvousInfo] = []
            with anyio.fail_after(5):
                scope, withdrawn = anyio.CancelScope(), anyio.Event()
                tg.start_soon(join_then_cancel, a, scope, withdrawn)
                await store.wait(["rdzv/run/c/0/tick"])  # a coordinates round 0
                tg.start_soon(join_into, got, b)
                await store.wait(["rdzv/run/c/0/node/1"])
                scope.cancel()
                await withdrawn.wait()
                # b moves on to round 1; the cancelled handler stays usable.
                tg.start_soon(join_into, got, a)
                tg.start_soon(join_into, got, c)
        assert sorted((i.rank, i.world_size, i.round) for i in got) == [
            (0, 3, 1),
            (1, 3, 1),
            (2, 3, 1),
        ]


async def test_transitions_are_recorded_as_rdzv_events(rdzv_event_names: list[str]) -> None:
    names = rdzv_event_names
    store = LocalStore()
    async with handlers(store, 2, 1, 2, last_call_timeout=0.05) as (a, b):
        with anyio.fail_after(5):
            await a.next_rendezvous()  # min 1: last call, then complete alone
            await b.set_closed()
        with anyio.fail_after(5), pytest.raises(RendezvousClosedError):
            await b.next_rendezvous()
    assert {"join", "last_call", "round_complete", "complete", "close"} <= set(names)
    async with handlers(LocalStore(), 1, 2, 2, join_timeout=0.1) as (h,):
        with anyio.fail_after(5), pytest.raises(RendezvousTimeoutError):
            await h.next_rendezvous()
    assert "timeout" in names


async def test_rdzv_events_are_named_after_the_handler_file() -> None:
    from aelastic import events

    async with events.subscribe("dynamic_rendezvous") as stream:
        async with handlers(LocalStore(), 1, 1, 1) as (h,):
            with anyio.fail_after(5):
                await h.next_rendezvous()
        names = set()
        while True:
            try:
                names.add(stream.receive_nowait().name)
            except anyio.WouldBlock:
                break
    assert {"_dynamic.py:join", "_dynamic.py:complete"} <= names, names


async def test_shutdown_while_joining_ends_the_join_gracefully() -> None:
    store = LocalStore()
    async with handlers(store, 1, 2, 2) as (h,):
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def join() -> None:
                try:
                    await h.next_rendezvous()
                except RendezvousGracefulExitError as exc:
                    errors.append(exc)

            tg.start_soon(join)
            with anyio.fail_after(5):
                await store.wait(["rdzv/run/c/0/tick"])
                assert await h.shutdown()
        assert len(errors) == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_leaves_and_rejoins_keep_rounds_consistent(seed: int) -> None:
    """6 nodes (min 2, max 4) rejoin, leave and wait at random; every round they report
    has one world size and distinct ranks below it, and nothing hangs."""
    rng = random.Random(seed)
    store = LocalStore()
    seen: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    settings = dict(last_call_timeout=0.05, keep_alive_interval=0.02, heartbeat_timeout=0.08)

    async def node(r: random.Random) -> None:
        async with make(store, 2, 4, **settings) as h:
            for _ in range(12):
                info = await h.next_rendezvous()
                seen[info.round].append((info.rank, info.world_size))
                choice = r.random()
                if choice < 0.3:
                    # Not forever: with a full world and spares waiting, nothing changes.
                    with anyio.move_on_after(0.5):
                        await h.wait_for_membership_change()
                elif choice < 0.5:
                    await h.shutdown()
                else:
                    with anyio.move_on_after(r.random() * 0.05):
                        await h.wait_for_membership_change()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def one(r: random.Random) -> None:
                await node(r)
                tg.cancel_scope.cancel()  # the others may now lack min_nodes: stop

            for _ in range(6):
                tg.start_soon(one, random.Random(rng.random()))
    assert len(seen) >= 5
    for rows in seen.values():
        (world,) = {w for _, w in rows}
        ranks = [r for r, _ in rows]
        assert 2 <= world <= 4
        assert len(set(ranks)) == len(ranks) and max(ranks) < world
