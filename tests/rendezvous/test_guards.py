"""The coordinator's "lost" orders placed ahead (``_guards.LostOrders``), on a real
ephemeral session of a TCP client: what the store writes when the session ends."""

from __future__ import annotations

import anyio
from anyio.abc import TaskGroup

from aelastic.rendezvous._guards import LostOrders
from aelastic.store import StoreServer, TCPStoreClient
from aelastic.store._interface import EphemeralSession


def _orders(session: EphemeralSession, tg: TaskGroup, placed: list[int]) -> LostOrders:
    async def register(k: int) -> int | None:
        action_id = await session.on_close("set", f"tick/{k}", "lost")
        placed.append(k)
        return action_id

    async def cancel(action_id: int) -> None:
        await session.cancel(action_id)

    return LostOrders(register, cancel, tg)


async def _written(server: StoreServer) -> list[str]:
    return sorted(k for k in await server.local_store.list_keys() if k.startswith("tick/"))


async def test_an_order_is_placed_before_hold_returns_and_the_next_one_ahead(
    store_server: StoreServer,
) -> None:
    placed: list[int] = []
    async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as client:
        async with client.ephemeral() as session:
            async with anyio.create_task_group() as tg:
                orders = _orders(session, tg, placed)
                await orders.hold(0)
                assert 1 in placed  # placed (confirmed) before tick 0 may go out
                await orders.release(0)  # tick 0 is out: nothing held for it
                await orders.hold(1)
                assert 2 in placed
                await orders.release(1)  # tick 1 is out: its order is withdrawn
            assert sorted(placed) == [1, 2, 3]  # 3 was placed in the background
        # The session ends without cancelling (as when the coordinator dies after tick 1):
        # "lost" is written at every tick after the last one published, none before.
        with anyio.fail_after(10):
            await store_server.local_store.wait(["tick/2", "tick/3"])
        assert await _written(store_server) == ["tick/2", "tick/3"]


async def test_releasing_all_withdraws_orders_still_being_placed(
    store_server: StoreServer,
) -> None:
    placed: list[int] = []
    client = TCPStoreClient(store_server.host, store_server.port, timeout=10)
    async with client, client.ephemeral() as session, anyio.create_task_group() as tg:
        orders = _orders(session, tg, placed)
        orders.start(1)
        orders.start(2)
        await orders.release()  # the round's last tick is out (closed, dissolved)
        assert sorted(placed) == [1, 2]
        assert await session.cancel() == 0  # nothing left on the session
    assert await _written(store_server) == []
