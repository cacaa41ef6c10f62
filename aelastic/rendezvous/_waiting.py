"""Say who waits for whom while a node of an elastic rendezvous (c10d, etcd) waits for peers.

The static backend says up front which node ranks are missing (``_static_join``). An
elastic round has no fixed ranks and may legitimately wait, so a joining node says
periodically (``wait_report_interval``, 30 s by default, in ``--rdzv-conf``) what it
knows: the run id, where the rendezvous lives, how many nodes joined of
``min_nodes``/``max_nodes``, how long it waited and may still wait, and the flags that
bring the other nodes in. Silence for a whole ``join_timeout`` (600 s) looked like a hang.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio

from .._tasks import background_tasks

__all__ = ("WAIT_REPORT_INTERVAL", "reporting_wait", "waiting_message")

#: Default seconds between two "still waiting" lines (``--rdzv-conf wait_report_interval``).
WAIT_REPORT_INTERVAL = 30.0

log = logging.getLogger(__name__)


def waiting_message(
    *,
    backend: str,
    run_id: str,
    endpoint: str,
    min_nodes: int,
    max_nodes: int,
    waited: float,
    join_timeout: float,
    progress: str,
    joined: int | None = None,
    last_call_timeout: float | None = None,
) -> str:
    """The "still waiting" line: who (this host) waits for whom, how long, and the fix.

    ``progress`` is what the backend knows of the round (e.g. ``round 0: 1 joined``).
    ``joined``: the live nodes of the round, where known. Once they reach ``min_nodes``
    (but not ``max_nodes``) the round is in its last call for more nodes, not short of
    peers: the line then says so, how long the last call is (``last_call_timeout``) and
    how to change it, and asks for no other node.
    """
    left = max(0.0, join_timeout - waited)
    if joined is not None and last_call_timeout is not None and min_nodes <= joined < max_nodes:
        return (
            f"rendezvous {run_id!r} ({backend} at {endpoint}): {progress}; min_nodes="
            f"{min_nodes} is met, so the round completes once max_nodes={max_nodes} nodes "
            f"joined or at the end of its last call for more nodes ({last_call_timeout:g} s "
            "from the moment the minimum was reached; set it with --rdzv-conf "
            "last_call_timeout=SECONDS)"
        )
    return (
        f"rendezvous {run_id!r} ({backend} at {endpoint}): this node ({socket.gethostname()}) "
        f"has waited {waited:.0f} s for its peers ({progress}; min_nodes={min_nodes}, "
        f"max_nodes={max_nodes}); it waits up to {left:.0f} s more (join_timeout="
        f"{join_timeout:g}). Start the other nodes with --rdzv-backend {backend} "
        f"--rdzv-endpoint {endpoint} --rdzv-id {run_id} (python -m aelastic status with "
        "these flags lists the nodes that joined)"
    )


@asynccontextmanager
async def reporting_wait(
    describe: Callable[[float], Awaitable[str]], interval: float
) -> AsyncIterator[None]:
    """For the block: every ``interval`` seconds, log ``await describe(waited)`` as a warning.

    ``describe`` is bounded by ``interval``; its error (an unreachable store) is logged
    instead of its line, never raised. The block's own exceptions leave unchanged;
    leaving the block cancels the reporter.
    """
    async with background_tasks() as tg:
        tg.start_soon(_report, describe, interval)
        yield


async def _report(describe: Callable[[float], Awaitable[str]], interval: float) -> None:
    started = anyio.current_time()
    while True:
        await anyio.sleep(interval)
        waited = anyio.current_time() - started
        try:
            with anyio.fail_after(interval):
                line = await describe(waited)
        except Exception as exc:  # a report must never end the wait it reports on
            line = f"still waiting for the rendezvous after {waited:.0f} s ({exc})"
        log.warning("%s", line)
