"""The static rendezvous's join: each node announces itself, each waits for all of them.

torch's static rendezvous waits inside its TCPStore server for ``world_size`` clients
and, after ``timeout``, fails with "1/2 clients joined" and a traceback. Here each node
sets ``rdzv/<run>/static/node/<rank>`` once its handler has reached the store, and
:func:`wait_for_nodes` waits for every rank's key. When one is missing it says so up
front (how many joined of how many, which ranks are missing, how long it waits and
which flags set up a multi-node rendezvous), and on timeout it raises one error that
says the same, never a store key.
"""

from __future__ import annotations

import logging

import anyio

from ..store import StoreTimeoutError
from ._exceptions import RendezvousTimeoutError
from ._ops import Ops

__all__ = ("announce", "check_host", "wait_for_nodes")

#: How long the probe of node rank 0's store may take before it counts as missing.
_PROBE_SECONDS = 5.0

log = logging.getLogger(__name__)


def _node_key(run_id: str, rank: int) -> str:
    return f"rdzv/{run_id}/static/node/{rank}"


def _ranks(ranks: list[int]) -> str:
    return ("node rank " if len(ranks) == 1 else "node ranks ") + ", ".join(map(str, ranks))


def _how_to_start(missing: list[int], world_size: int, endpoint: str) -> str:
    port = endpoint.rpartition(":")[2]
    node_rank = str(missing[0]) if len(missing) == 1 else "R"
    return (
        f"start {_ranks(missing)} with --nnodes {world_size} --node-rank {node_rank} "
        f"--master-addr <node rank 0's address> --master-port {port}; or, for an elastic "
        "job, give every node --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB. "
        "--rdzv-conf timeout=SECONDS sets this wait"
    )


async def check_host(
    host: str, port: int, *, run_id: str, rank: int, world_size: int, within: float
) -> None:
    """Say up front when node rank 0's store does not accept connections yet.

    One TCP connection attempt (closed at once), bounded by a few seconds; on refusal
    or timeout logs a warning naming node rank 0, the wait ``within`` and how to start
    it, then returns: the caller's own connect does the waiting. Never raises.
    """
    try:
        with anyio.fail_after(min(_PROBE_SECONDS, within)):
            stream = await anyio.connect_tcp(host, port)
    except (OSError, TimeoutError):
        log.warning(
            "static rendezvous (run id %r), this node is node rank %d: node rank 0 does not "
            "host the store at %s:%d yet; waiting up to %g s for it: %s",
            run_id,
            rank,
            host,
            port,
            within,
            _how_to_start([0], world_size, f"{host}:{port}"),
        )
    else:
        with anyio.move_on_after(1, shield=True):
            await stream.aclose()


async def announce(ops: Ops, run_id: str, rank: int) -> None:
    """Record that node ``rank`` has reached the store (idempotent).

    Raises:
        RendezvousConnectionError: the store is unreachable.
    """
    await ops.set(_node_key(run_id, rank), "1")


async def wait_for_nodes(
    ops: Ops, *, run_id: str, rank: int, world_size: int, endpoint: str, within: float
) -> None:
    """Return once every node rank of the static world has announced itself.

    Returns at once (one store request) when all have. Otherwise logs a warning naming
    the missing ranks, the wait and the flags that start them, then waits on their keys
    (no polling) for at most ``within`` seconds in all (the static ``timeout`` setting).
    Cancellation leaves nothing behind.

    Raises:
        RendezvousTimeoutError: some node did not join within ``within`` seconds; the message
            names the missing ranks and how to start them.
        RendezvousConnectionError: the store is unreachable.
    """
    keys = [_node_key(run_id, r) for r in range(world_size)]
    if world_size == 1 or await ops.store.check(keys):
        return
    missing = [r for r in range(world_size) if not await ops.check(keys[r])]
    if not missing:
        return
    log.warning(
        "static rendezvous (run id %r, store %s hosted by node rank 0), this node is node "
        "rank %d: %d of %d nodes joined; waiting up to %g s for %s: %s",
        run_id,
        endpoint,
        rank,
        world_size - len(missing),
        world_size,
        within,
        _ranks(missing),
        _how_to_start(missing, world_size, endpoint),
    )
    with anyio.move_on_after(within):
        while missing:
            try:
                await ops.get(keys[missing[0]], timeout=within)
            except StoreTimeoutError:
                break
            log.info("static rendezvous: %s joined", _ranks(missing[:1]))
            del missing[0]
    if missing:
        fix = _how_to_start(missing, world_size, endpoint)
        raise RendezvousTimeoutError(
            f"static rendezvous (run id {run_id!r}, store {endpoint}): only "
            f"{world_size - len(missing)} of {world_size} nodes joined within timeout="
            f"{within:g}s; {_ranks(missing)} never came: {fix}"
        )
