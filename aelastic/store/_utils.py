"""Coordination helpers over any :class:`Store`: ``barrier`` (in two steps, ``arrive_at_barrier``
and ``wait_for_departures``, for the store's host), ``synchronize``, ``get_all``."""

from __future__ import annotations

import contextlib

from ._exceptions import StoreClosedError, StoreConnectionError, StoreTimeoutError
from ._interface import Store, Value, to_bytes

__all__ = ("arrive_at_barrier", "barrier", "get_all", "synchronize", "wait_for_departures")


def _check_world(world_size: int) -> None:
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")


async def barrier(
    store: Store,
    world_size: int,
    key_prefix: str,
    *,
    timeout: float | None = None,
    linger: float | None = None,
) -> None:
    """Return once ``world_size`` participants called ``barrier`` with this ``key_prefix``.

    :func:`arrive_at_barrier`, then, with ``linger``, :func:`wait_for_departures`
    (for the participant that serves the store). Raises as they do.
    """
    arrival = await arrive_at_barrier(store, world_size, key_prefix, timeout=timeout)
    if linger is not None:
        await wait_for_departures(store, world_size, key_prefix, arrival, within=linger)


async def arrive_at_barrier(
    store: Store, world_size: int, key_prefix: str, *, timeout: float | None = None
) -> int:
    """Return this participant's arrival number once ``world_size`` participants arrived.

    Reusable for any number of rounds: a shared arrival counter
    (``{key_prefix}/arrived``) numbers the arrivals, so arrival ``n`` belongs to
    round ``(n - 1) // world_size``; the last arrival of a round sets
    ``{key_prefix}/round/<r>`` and everyone waits for that key. Each participant
    then acknowledges the round with ``{key_prefix}/left/<n>``, a ``set``: it has no
    reply, so nothing is left to read once it is sent. Costs each participant one
    ``add``, one ``wait`` and one or two ``set``: O(1) requests, no polling.

    Raises :class:`~aelastic.store.StoreTimeoutError` if the round does not
    complete within ``timeout`` (default: the store's timeout). Cancelling a
    waiting participant does not undo its arrival (the counter is not
    decremented), so a cancelled participant must not be replaced within the
    same round.
    """
    _check_world(world_size)
    arrival = await store.add(f"{key_prefix}/arrived", 1)
    done = f"{key_prefix}/round/{(arrival - 1) // world_size}"
    if arrival % world_size == 0:
        await store.set(done, b"1")
    else:
        await store.wait([done], timeout=timeout)
    # The round is complete whatever becomes of this acknowledgement: a host that
    # stopped waiting for it (``wait_for_departures`` is bounded) has closed the store.
    with contextlib.suppress(StoreConnectionError, StoreClosedError):
        await store.set(f"{key_prefix}/left/{arrival}", b"1")
    return arrival


async def wait_for_departures(
    store: Store, world_size: int, key_prefix: str, arrival: int, *, within: float
) -> None:
    """Wait until the round of ``arrival`` was acknowledged by every other participant.

    For the participant that serves the store, before it leaves (which closes the
    store): leaving at once would reset the connections of peers whose ``wait`` the
    server has not answered yet, and they would fail a barrier that completed.
    Waits at most ``within`` seconds: a peer that died or hangs after arriving never
    acknowledges, and returning (not raising) then is what a finished job needs.
    """
    first = (arrival - 1) // world_size * world_size + 1
    others = [f"{key_prefix}/left/{n}" for n in range(first, first + world_size) if n != arrival]
    if others:
        with contextlib.suppress(StoreTimeoutError):  # that peer gets no more of our time
            await store.wait(others, timeout=within)


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
