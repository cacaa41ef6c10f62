"""Coordination helpers over any :class:`Store`: ``barrier``, ``synchronize``, ``get_all``."""

from __future__ import annotations

from ._interface import Store, Value, to_bytes

__all__ = ("barrier", "synchronize", "get_all")


def _check_world(world_size: int) -> None:
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")


async def barrier(
    store: Store, world_size: int, key_prefix: str, *, timeout: float | None = None
) -> None:
    """Return once ``world_size`` participants called ``barrier`` with this ``key_prefix``.

    Reusable for any number of rounds: a shared arrival counter
    (``{key_prefix}/arrived``) numbers the arrivals, so arrival ``n`` belongs to
    round ``(n - 1) // world_size``; the last arrival of a round sets
    ``{key_prefix}/round/<r>`` and everyone waits for that key. Costs each
    participant one ``add``, one ``wait`` and (last arrival only) one ``set``:
    O(1) requests, no polling.

    Raises :class:`~aelastic.store.StoreTimeoutError` if the round does not
    complete within ``timeout`` (default: the store's timeout). Cancelling a
    waiting participant does not undo its arrival (the counter is not
    decremented), so a cancelled participant must not be replaced within the
    same round.
    """
    _check_world(world_size)
    arrived = await store.add(f"{key_prefix}/arrived", 1)
    done = f"{key_prefix}/round/{(arrived - 1) // world_size}"
    if arrived % world_size == 0:
        await store.set(done, b"1")
        return
    await store.wait([done], timeout=timeout)


async def get_all(store: Store, rank: int, prefix: str, world_size: int) -> list[bytes]:
    """Return the values of ``f"{prefix}{i}"`` for ``i in range(world_size)``, waiting for all.

    One ``multi_get`` (plus its wait) per caller. ``rank`` is the caller's rank
    (torch's signature); it is only used in error messages.
    """
    _check_world(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    return await store.multi_get([f"{prefix}{i}" for i in range(world_size)])


async def synchronize(
    store: Store,
    data: Value,
    rank: int,
    world_size: int,
    key_prefix: str,
    timeout: float | None = None,
) -> list[bytes]:
    """All-gather: publish ``data`` as ``f"{key_prefix}{rank}"``; return everyone's data by rank.

    Raises :class:`~aelastic.store.StoreTimeoutError` if some rank has not
    published within ``timeout`` (default: the store's timeout).
    """
    _check_world(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    await store.set(f"{key_prefix}{rank}", to_bytes(data))
    return await store.multi_get([f"{key_prefix}{i}" for i in range(world_size)], timeout=timeout)
