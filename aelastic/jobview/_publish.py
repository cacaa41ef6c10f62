"""The status publisher: one task per agent writing its node's status into the store.

It writes on each state change of the worker group (at most one write per
``min_gap`` seconds, terminal states at once), on the workers' progress (a new step:
at most once a second in runs of up to 300 nodes, see :func:`progress_period`) and
every ``interval`` seconds (longer in runs of more than 500 nodes: see
:func:`period`): one
``set`` of a small document (plus one ``append`` to the run's index when the node
first writes to a store, e.g. after a c10d store was re-hosted by the heir).
Publishing is best effort: a store error is logged and the next write tries again,
the job never waits on it (each write is bounded by ``interval``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ._history import History
from ._keys import INDEX_KEY, REPLICAS_KEY, node_key, status_store
from ._node import FORMAT, describe_exit, new_node_id, node_status, worker_rows
from ._view import read_view

if TYPE_CHECKING:
    from ._source import Change, NodeSource

__all__ = (
    "DEFAULT_INTERVAL",
    "MAX_RUN_RATE",
    "PROGRESS_NODES",
    "StatusPublisher",
    "due",
    "period",
    "progress_period",
    "publish_replicas",
)

log = logging.getLogger("aelastic.jobview")

#: Seconds between two periodic status writes of an agent.
DEFAULT_INTERVAL = 5.0
#: Least seconds between two writes caused by state changes (a restart is a burst of them).
MIN_GAP = 1.0
#: Periodic status writes per second a whole run may cost its store: beyond 500 nodes
#: each agent writes less often (1,000 nodes: every 10 s), so the store's load is bounded.
MAX_RUN_RATE = 100.0


#: Least seconds between two writes caused by the workers' progress (a new step).
PROGRESS_GAP = 1.0
#: Runs of up to this many nodes write on progress; at most ``PROGRESS_NODES /
#: PROGRESS_GAP`` writes per second reach the store from progress (300), larger runs
#: keep the periodic writes alone (at most ``MAX_RUN_RATE`` per second).
PROGRESS_NODES = 300


def period(interval: float, nodes: int) -> float:
    """Seconds between an agent's periodic writes in a run of ``nodes`` nodes."""
    return max(interval, nodes / MAX_RUN_RATE)


def progress_period(interval: float, nodes: int) -> float:
    """Seconds between two looks at the workers' steps, a write when one moved, in a run
    of ``nodes`` nodes: :data:`PROGRESS_GAP` up to :data:`PROGRESS_NODES` nodes (what
    ``aelastic status`` shows is then at most about a second old), else the periodic
    :func:`period` (the store's load stays bounded in large runs)."""
    if nodes <= PROGRESS_NODES:
        return min(PROGRESS_GAP, period(interval, nodes))
    return period(interval, nodes)


def due(progressed: bool, since_write: float, interval: float, nodes: int) -> bool:
    """Whether a look at the workers (no state change) writes the status: its steps
    moved since the last write and :func:`progress_period` passed, or the periodic
    :func:`period` passed (``since_write``: seconds since the last write)."""
    if since_write >= period(interval, nodes):
        return True
    return progressed and since_write >= progress_period(interval, nodes)


_TERMINAL = ("SUCCEEDED", "FAILED")
#: Seconds a node waits at its end for its peers' final ledgers (see ``end_view``).
END_WAIT = 3.0


def done_with(node: dict[str, Any], ended: int) -> bool:
    """Whether ``node`` (a node of the view) no longer holds up a peer's end: it wrote
    ``"ended" >= ended`` or it is stale (gone)."""
    mark = node.get("ended")
    return bool(node.get("stale")) or (isinstance(mark, int) and mark >= ended)


async def publish_replicas(handler: Any, record: dict[str, Any], within: float = 2.0) -> bool:
    """Write a torchft replica-group job's ``record`` (the groups, the quorum's
    membership: see ``aelastic.launcher``'s replica-group runner) into the status store
    of ``handler``'s run, where :func:`~aelastic.jobview.read_view` finds it.

    Best effort, like the node statuses: return whether it was written; a store error
    or no store yet is False. Never raises but cancellation; bounded by ``within``.
    """
    found = status_store(handler)
    if found is None:
        return False
    raw = json.dumps({"v": FORMAT, **record}, separators=(",", ":"))
    with anyio.move_on_after(within):
        try:
            await found[0].set(REPLICAS_KEY, raw)
        except Exception as exc:  # best effort: the job must not fail on its view
            log.debug("replica-group record not published: %s", exc)
            return False
        return True
    return False


class StatusPublisher:
    """Publishes one job's node status; ``await task_group.start(publisher.run)``.

    ``node`` is this agent's node id (unique per agent). :meth:`note` adds a mark to the
    node's history (any kind: ``"excluded"``...) and publishes it soon.
    """

    def __init__(
        self,
        job: NodeSource,
        handler: Any,
        *,
        interval: float = DEFAULT_INTERVAL,
        min_gap: float = MIN_GAP,
        node: str | None = None,
    ) -> None:
        if not interval > 0 or not min_gap >= 0:
            raise ValueError(f"need interval > 0 and min_gap >= 0, got {interval}, {min_gap}")
        self.job = job
        self.handler = handler
        self.interval = interval
        self.min_gap = min_gap
        self.node = node or new_node_id()
        self.history = History()
        #: status writes that reached the store, and those that failed
        self.published = 0
        self.failed = 0
        self._wake = anyio.Event()
        self._urgent = False
        self._token: object | None = None  # the store connection our index entry is in
        self._hangs = 0
        self._world: int | None = None
        self._written: list[int | None] = []  # the steps of the last write
        self._ended = 0  # see end_view

    def note(self, kind: str, detail: str = "", when: float | None = None) -> None:
        """Mark ``kind`` (an open set: ``restart``, ``hang``, ``node_lost``... or any
        short string) in the node's history now, and publish soon. Never blocks."""
        self.history.mark(time.time() if when is None else when, kind, detail)
        self._wake.set()

    def wake(self) -> None:
        """Publish soon: the rendezvous handler was entered, so its store is reachable and
        a node that waits for its peers shows in ``aelastic status``. Never blocks."""
        self._urgent = True  # not held back by the failed write before the store was up
        self._wake.set()

    async def read_view(self) -> dict[str, Any]:
        """Every node's status in this job's store (see :func:`read_view`).

        Raises:
            JobViewError: the store has no status for the run, or does not answer.
        """
        from ._exceptions import JobViewError

        found = status_store(self.handler)
        if found is None:
            raise JobViewError(
                f"the rendezvous backend {self.handler.get_backend()!r} has no store to read "
                "the job's status from (use c10d or etcd), or it has not started yet"
            )
        return await read_view(found[0], self.job.run_id)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Publish until cancelled, or until the job is done (after a last write)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow_changes)
            task_status.started()
            last = -math.inf
            while True:
                nodes = self._nodes()
                woken = False
                with anyio.move_on_after(progress_period(self.interval, nodes)):
                    await self._wake.wait()
                    woken = True
                if not woken and not due(
                    self._steps() != self._written, time.monotonic() - last, self.interval, nodes
                ):
                    continue  # nothing new to show: no write
                wait = last + self.min_gap - time.monotonic()
                if wait > 0 and not self._urgent:
                    await anyio.sleep(wait)  # coalesce a burst of changes into one write
                self._wake, self._urgent = anyio.Event(), False
                last = time.monotonic()
                await self.publish_once()
                if self.job.done:
                    tg.cancel_scope.cancel()
                    return

    def _nodes(self) -> int:
        workers = self.job.workers()
        return workers[0].world_size // len(workers) if workers else 1

    def _steps(self) -> list[int | None]:
        """The local workers' steps now (read from shared memory: no I/O)."""
        return [w["step"] for w in worker_rows(self.job)]

    async def publish_once(self) -> bool:
        """Write the node's status now; return whether it reached the store. Never raises
        but cancellation; bounded by ``interval``."""
        found = status_store(self.handler)
        if found is None:
            return False
        store, token = found
        self._note_hangs()
        now = time.time()
        workers = worker_rows(self.job)
        steps = [w["step"] for w in workers]
        self._written = steps
        if any(s is not None for s in steps):
            self.history.sample(now, steps)
        if self._token is not None and token != self._token:
            self.history.mark(now, "store_moved", "the rendezvous store moved to a new host")
        every = period(self.interval, self._nodes())
        doc = node_status(self.job, self.node, self.history, every, now, workers)
        if self._ended:
            doc["ended"] = self._ended
        raw = json.dumps(doc, separators=(",", ":"))
        with anyio.move_on_after(self.interval):
            try:
                await store.set(node_key(self.node), raw)
                if token != self._token:
                    await store.append(INDEX_KEY, self.node + "\n")
                    self._token = token
            except Exception as exc:  # best effort: the job must not fail on its view
                self.failed += 1
                log.debug("status of node %s not published: %s", self.node, exc)
                return False
            self.published += 1
            return True
        self.failed += 1
        return False

    async def end_view(
        self, within: float = END_WAIT, *, peers_running: bool = False
    ) -> dict[str, Any] | None:
        """At the job's end, before the rendezvous handler is left: the job's view with
        every node's final ledger, for the one end line that gives the job's goodput.

        Writes this node's last status (``"ended": 1``), waits until every other live
        node of its round wrote its own, reads the view, then writes ``"ended": 2`` and
        waits until those nodes read too: the node that hosts the store does not take
        it away before its peers read. All within ``within`` seconds; None when the view
        could not be read in time (no store, a store error, a peer that did not end;
        what happens after the read does not matter). Never raises but cancellation.

        ``peers_running`` (this node left the exit barrier while its peers' workers
        still ran): their final ledgers cannot come within ``within``, so nothing is
        waited for (it cost every such node ``within`` seconds): this node writes its
        last status as read (``"ended": 2``, so no peer waits for it either) and
        returns None.
        """
        view: dict[str, Any] | None = None
        with anyio.move_on_after(within):
            try:
                if peers_running:
                    self._ended = 2
                    await self.publish_once()
                    return None
                self._ended = 1
                await self.publish_once()
                view = await self._wait_peers(1)
                self._ended = 2
                await self.publish_once()
                await self._wait_peers(2)  # a store gone now: its host had what it needs
            except Exception as exc:  # best effort: the end line falls back to the node's
                log.debug("the job's view at the end: %s", exc)
        return view

    async def _wait_peers(self, ended: int) -> dict[str, Any]:
        """The view, read once every other live node of this node's last round (as
        published) has written ``"ended" >= ended`` (polled every 0.1 s; the caller
        bounds it). Nodes of other rounds are not waited for: those that left before
        have their last ledgers in the view, those of a later round go on without us."""
        while True:
            view = await self.read_view()
            mine = next((n for n in view["nodes"] if n.get("node") == self.node), None)
            last = None if mine is None else mine.get("round")
            peers = [
                n for n in view["nodes"] if n.get("node") != self.node and n.get("round") == last
            ]
            if all(done_with(n, ended) for n in peers):
                return view
            await anyio.sleep(0.1)

    def _note_hangs(self) -> None:
        count = self.job.hang_count
        if count > self._hangs:
            hang = self.job.last_hang
            where = "" if hang is None else f"rank {hang.global_rank} ({hang.rule} timeout)"
            self.history.mark(
                time.time() if hang is None else hang.detected_at, "hang", f"hung: {where}"
            )
            self._hangs = count

    async def _follow_changes(self) -> None:
        restarts = self.job.restart_count
        async for change in self.job.state_changes():
            self._on_change(change, restarts)
            restarts = change.restart_count
            if change.state.value in _TERMINAL:
                self._urgent = True
            self._wake.set()

    def _on_change(self, change: Change, restarts: int) -> None:
        if change.restart_count > restarts:
            failure = self.job.last_failure
            what = (
                ""
                if failure is None
                else f": rank {failure.global_rank} {describe_exit(failure.exitcode)}"
            )
            self.history.mark(change.timestamp, "restart", f"#{change.restart_count}{what}")
        if change.state.value == "HEALTHY":
            self._note_world(change)
        elif change.state.value == "FAILED" and change.remaining_restarts == 0:
            failure = self.job.last_failure
            what = (
                ""
                if failure is None
                else f"rank {failure.global_rank} {describe_exit(failure.exitcode)}"
            )
            self.history.mark(change.timestamp, "failed", what)

    def _note_world(self, change: Change) -> None:
        workers = self.job.workers()
        world = workers[0].world_size if workers else None
        if world is not None and self._world is not None and world != self._world:
            kind = "node_lost" if world < self._world else "membership"
            self.history.mark(
                change.timestamp, kind, f"round {change.round}: {self._world} -> {world} workers"
            )
        self._world = world
