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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
from anyio.abc import TaskGroup

from .._tasks import background_tasks

__all__ = ("WAIT_REPORT_INTERVAL", "WaitReporter", "reporting_wait", "waiting_message")

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

    A :class:`WaitReporter` of its own, in a task group of its own: for a one-off wait.
    A handler that waits again and again uses one reporter for all its waits (cheaper:
    see :class:`WaitReporter`).
    """
    async with background_tasks() as tg:
        with WaitReporter(interval).waiting(describe, tg):
            yield


class WaitReporter:
    """Logs, every ``interval`` seconds of a wait, ``await describe(waited)`` as a warning.

    One reporter serves the successive waits of one owner (a rendezvous handler): its
    task is started in the owner's task group by the first :meth:`waiting` and lives
    until that group is cancelled. A wait costs no task, no task group and no
    cancellation: entering sets a time and, if the task is idle, an event; leaving
    clears the time. (A task group and a 30 s sleep per wait, cancelled when the wait
    ended, cost 1,024 handlers in one process ~0.3 s per round.) The task then wakes at
    most once per ``interval`` after a wait, finds it over and goes idle.

    ``describe`` is bounded by ``interval``; its error (an unreachable store) is logged
    instead of its line, never raised. A line whose wait ended while ``describe`` ran is
    dropped. The task never raises; cancelled (its group ends), it stops, and the next
    :meth:`waiting` starts another in the group it is given.
    """

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._describe: Callable[[float], Awaitable[str]] | None = None
        self._since = 0.0
        self._wait_id = 0  # counts the waits: the task tells a wait from the next one
        self._armed: anyio.Event | None = None  # set while the task must look at a wait
        self._started = False

    @contextmanager
    def waiting(self, describe: Callable[[float], Awaitable[str]], tg: TaskGroup) -> Iterator[None]:
        """Report on the block's wait; the reporter's task runs in ``tg`` (started once).

        A wait inside another one (c10d reconnecting while joining) is reported instead
        of the outer one, which is reported again when the inner one ends.
        """
        outer, outer_since = self._describe, self._since
        self._arm(describe, anyio.current_time())
        if not self._started:
            self._started = True
            tg.start_soon(self._run)
        try:
            yield
        finally:
            if outer is None:
                self._describe = None
            else:
                self._arm(outer, outer_since)

    def _arm(self, describe: Callable[[float], Awaitable[str]], since: float) -> None:
        self._wait_id += 1
        self._describe, self._since = describe, since
        if self._armed is None:
            self._armed = anyio.Event()
        self._armed.set()

    async def _run(self) -> None:
        try:
            await self._serve()
        finally:  # the owner's task group ended: the next waiting() starts a new task
            self._started, self._armed = False, None

    async def _serve(self) -> None:
        assert self._armed is not None
        while True:
            await self._armed.wait()
            self._armed = anyio.Event()
            wait_id, since = self._wait_id, self._since
            due = since + self._interval
            # A later wait started after this one, so its first line is due later: this
            # loop never sleeps past a line that is due.
            while True:
                await anyio.sleep_until(due)
                describe = self._describe
                if describe is None or self._wait_id != wait_id:
                    break  # this wait ended; a later one set the event again
                waited = anyio.current_time() - since
                try:
                    with anyio.fail_after(self._interval):
                        line = await describe(waited)
                except Exception as exc:  # a report must never end the wait it reports on
                    line = f"still waiting for the rendezvous after {waited:.0f} s ({exc})"
                if self._describe is None or self._wait_id != wait_id:
                    break
                log.warning("%s", line)
                due = max(due + self._interval, anyio.current_time())
