"""Core semantics of every store (LocalStore, TCP client to our server, PrefixStore)."""

from __future__ import annotations

import anyio
import pytest

from aelastic.store import Store, StoreTimeoutError
from aelastic.store._exceptions import QueueEmptyError

from ._backends import on_every_backend


@on_every_backend
async def test_set_get_add(store: Store) -> None:
    await store.set("a", "1")
    assert await store.get("a") == b"1"
    await store.set("a", b"\x00\xff")
    assert await store.get("a") == b"\x00\xff"
    assert await store.add("n", 5) == 5
    assert await store.add("n", -7) == -2
    assert await store.get("n") == b"-2"


@on_every_backend
async def test_compare_set_cases(store: Store) -> None:
    assert await store.compare_set("k", "", "x") == b"x"  # missing, expected empty: set
    assert await store.compare_set("m", "e", "x") == b"e"  # missing, expected set: no-op
    assert not await store.check(["m"])
    assert await store.compare_set("k", "x", "y") == b"y"  # equal: set
    assert await store.compare_set("k", "z", "w") == b"y"  # different: current
    assert await store.get("k") == b"y"


@on_every_backend
async def test_check_wait_delete_keys(store: Store) -> None:
    assert not await store.check(["a"])
    await store.multi_set(["a", "b"], ["1", "2"])
    assert await store.check(["a", "b"])
    await store.wait(["a", "b"], timeout=1)
    assert await store.multi_get(["b", "a"]) == [b"2", b"1"]
    assert sorted(await store.list_keys()) == ["a", "b"]
    assert await store.num_keys() == 2
    assert await store.delete_key("a") is True
    assert await store.delete_key("a") is False
    await store.append("ap", "x")
    await store.append("ap", "y")
    assert await store.get("ap") == b"xy"


@on_every_backend
async def test_queues(store: Store) -> None:
    with pytest.raises(QueueEmptyError, match="q' is empty"):
        await store.queue_pop("q", block=False)
    await store.queue_push("q", "1")
    await store.queue_push("q", "2")
    assert await store.queue_len("q") == 2
    assert await store.queue_pop("q") == b"1"
    assert await store.queue_pop("q", block=False) == b"2"
    assert await store.queue_len("q") == 0
    got: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def pop() -> None:
            got.append(await store.queue_pop("q2", timeout=5))

        tg.start_soon(pop)
        tg.start_soon(pop)
        await anyio.wait_all_tasks_blocked()
        await store.queue_push("q2", "a")
        await store.queue_push("q2", "b")
    assert sorted(got) == [b"a", b"b"]


@on_every_backend
async def test_blocking_get_is_woken(store: Store) -> None:
    async with anyio.create_task_group() as tg:
        result: list[bytes] = []

        async def getter() -> None:
            result.append(await store.get("late", timeout=5))

        tg.start_soon(getter)
        await anyio.wait_all_tasks_blocked()
        assert await store.add("other", 1) == 1  # not stalled by the blocked get
        await store.set("late", "v")
    assert result == [b"v"]


@on_every_backend
async def test_timeouts_name_key(store: Store) -> None:
    with pytest.raises(StoreTimeoutError, match=r"timed out after 0.1 s waiting for key '.*never'"):
        await store.get("never", timeout=0.1)
    with pytest.raises(TimeoutError):
        await store.wait(["never", "x"], timeout=0.1)
    with pytest.raises(StoreTimeoutError):
        await store.queue_pop("never", timeout=0.1)
    await store.set("still", "usable")
    assert await store.get("still") == b"usable"
