"""EtcdStore against a real etcd: every Store operation, blocking waits, restarts."""

from __future__ import annotations

import anyio
import pytest

from aelastic.rendezvous.etcd._client import EtcdClient, EtcdConfig, parse_endpoints
from aelastic.rendezvous.etcd._store import EtcdStore
from aelastic.store import StoreConnectionError, StoreError, StoreTimeoutError
from aelastic.store._exceptions import QueueEmptyError


@pytest.fixture
def store(etcd_client: EtcdClient, run_id: str) -> EtcdStore:
    return EtcdStore(etcd_client, f"/aelastic-test/{run_id}/", timeout=5)


async def test_set_get_check_delete_list(store: EtcdStore) -> None:
    await store.set("a", "1")
    await store.set("b/c", b"\x00\xff")
    assert await store.get("a") == b"1"
    assert await store.get("b/c") == b"\x00\xff"
    assert await store.check(["a", "b/c"])
    assert not await store.check(["a", "zz"])
    assert sorted(await store.list_keys()) == ["a", "b/c"]
    assert await store.num_keys() == 2
    assert await store.delete_key("a")
    assert not await store.delete_key("a")
    assert await store.num_keys() == 1


async def test_add_compare_set_append(store: EtcdStore) -> None:
    assert await store.add("n", 3) == 3
    assert await store.add("n", -1) == 2
    assert await store.get("n") == b"2"
    # torch's compare_set table
    assert await store.compare_set("c", "", "x") == b"x"
    assert await store.compare_set("missing", "e", "x") == b"e"
    assert not await store.check(["missing"])
    assert await store.compare_set("c", "x", "y") == b"y"
    assert await store.compare_set("c", "nope", "z") == b"y"
    await store.append("ap", "ab")
    await store.append("ap", b"cd")
    assert await store.get("ap") == b"abcd"
    await store.set("txt", "abc")
    with pytest.raises(StoreError, match="not an integer"):
        await store.add("txt", 1)


async def test_concurrent_add_is_atomic(store: EtcdStore) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(store.add, "ctr", 1)
    assert await store.get("ctr") == b"40"


async def test_multi_set_multi_get(store: EtcdStore) -> None:
    await store.multi_set(["x", "y"], ["1", b"2"])
    assert await store.multi_get(["y", "x"]) == [b"2", b"1"]
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        await store.multi_set(["x", "y"], ["1"])


async def test_get_and_wait_block_until_set(store: EtcdStore) -> None:
    results: list[object] = []

    async def getter() -> None:
        results.append(await store.get("late"))

    async def waiter() -> None:
        await store.wait(["w1", "w2"])
        results.append("waited")

    async def multi() -> None:
        results.append(await store.multi_get(["w2", "late"]))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter)
            tg.start_soon(waiter)
            tg.start_soon(multi)
            await anyio.wait_all_tasks_blocked()
            await store.set("late", "v")
            await store.multi_set(["w1", "w2"], ["1", "2"])
    assert sorted(map(str, results)) == sorted(map(str, [b"v", "waited", [b"2", b"v"]]))


async def test_get_timeout_names_key_and_endpoint(store: EtcdStore) -> None:
    with pytest.raises(StoreTimeoutError, match="'nokey'") as info:
        await store.get("nokey", timeout=0.2)
    assert info.value.key == "nokey"
    assert store.client.endpoint in str(info.value)
    with pytest.raises(TimeoutError):
        await store.wait(["nokey"], timeout=0.1)


async def test_queue_fifo_and_blocking_pop(store: EtcdStore) -> None:
    for i in range(3):
        await store.queue_push("ev", f"e{i}")
    await store.queue_push("ev/other", "x")  # a different queue
    assert await store.queue_len("ev") == 3
    assert [await store.queue_pop("ev") for _ in range(3)] == [b"e0", b"e1", b"e2"]
    with pytest.raises(QueueEmptyError):
        await store.queue_pop("ev", block=False)
    assert await store.queue_len("ev/other") == 1
    assert await store.num_keys() == 0  # queues are not keys

    popped: list[bytes] = []

    async def popper() -> None:
        popped.append(await store.queue_pop("ev", timeout=5))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(popper)
            tg.start_soon(popper)
            await anyio.wait_all_tasks_blocked()
            await store.queue_push("ev", "a")
            await store.queue_push("ev", "b")
    assert sorted(popped) == [b"a", b"b"]
    with pytest.raises(StoreTimeoutError, match="pop queue 'ev'"):
        await store.queue_pop("ev", timeout=0.2)


async def test_prefixed_stores_are_disjoint(store: EtcdStore) -> None:
    r0, r1 = store.prefixed("round/0"), store.prefixed("round/1")
    await r0.set("k", "0")
    await r1.set("k", "1")
    assert await r0.get("k") == b"0"
    assert await r1.list_keys() == ["k"]


async def test_unreachable_etcd_raises_clear_error() -> None:
    from _etcd_server import free_port

    port = free_port()
    config = EtcdConfig(tuple(parse_endpoints(f"127.0.0.1:{port}")), read_timeout=0.5)
    async with EtcdClient(config) as client:
        store = EtcdStore(client, "/x/")
        with anyio.fail_after(5), pytest.raises(StoreConnectionError, match="etcd unreachable"):
            await store.set("k", "v")


async def test_failover_to_second_endpoint(etcd_endpoint: str, run_id: str) -> None:
    from _etcd_server import free_port

    dead = f"127.0.0.1:{free_port()}"
    config = EtcdConfig(tuple(parse_endpoints(f"{dead},{etcd_endpoint}")), read_timeout=5)
    async with EtcdClient(config) as client:
        store = EtcdStore(client, f"/{run_id}/")
        with anyio.fail_after(5):
            await store.set("k", "v")
            assert await store.get("k") == b"v"
        assert client.endpoint == etcd_endpoint


def test_parse_endpoints() -> None:
    assert parse_endpoints("h1:1,h2, http://h3:3/") == [("h1", 1), ("h2", 2379), ("h3", 3)]
    assert parse_endpoints("[::1]:5") == [("::1", 5)]
    with pytest.raises(ValueError, match="bad port"):
        parse_endpoints("h:notaport")
    with pytest.raises(ValueError, match="empty etcd endpoint"):
        parse_endpoints("h:1,,")


async def test_blocked_get_survives_etcd_restart(store: EtcdStore, etcd_server: object) -> None:
    from _etcd_server import EtcdServer

    assert isinstance(etcd_server, EtcdServer)
    await store.set("before", "1")
    got: list[bytes] = []

    async def getter() -> None:
        got.append(await store.get("after-restart", timeout=20))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter)
            await anyio.wait_all_tasks_blocked()
            etcd_server.kill()
            await anyio.to_thread.run_sync(etcd_server.start)  # same data dir and port
            await store.set("after-restart", "2")
    assert got == [b"2"]
    assert await store.get("before") == b"1"  # data survived


async def test_more_keys_than_one_transaction_holds(store: EtcdStore) -> None:
    keys = [f"many/{i}" for i in range(300)]  # etcd allows 128 operations per transaction
    await store.multi_set(keys, [str(i) for i in range(300)])
    assert await store.multi_get(keys) == [str(i).encode() for i in range(300)]
    assert await store.check(keys)
