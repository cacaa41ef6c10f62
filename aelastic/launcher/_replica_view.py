"""What ``aelastic status`` shows of a replica-group job: the groups and the quorum.

The runner (:func:`run_replica_groups`) keeps a :class:`GroupsView`: each local
group's state (``running``, ``completed``, ``excluded``), its restarts (spares' too)
and how often a spare took its place. :meth:`GroupsView.run` polls, every second,
the Lighthouse's status page (the quorum's members and their steps; membership
changes over time) and each running group's own job view (its nodes and steps),
and writes the record (:meth:`GroupsView.record`) into every local group's status
store, where ``aelastic status`` and the live page read it. On many nodes a runner
knows its own group only; the quorum lists every group's replica.

A group's step is its workers' ``aelastic.progress`` step when they report one, else
its replica's step in the last quorum it was part of (the member whose id ends in
the group's number, torchft's own convention: :func:`aelastic.replicas._quorum.member_group`);
``replica_id`` names it in the last quorum, None when that quorum left it out.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .. import events
from ..jobview._publish import publish_replicas
from ..replicas import LighthouseError
from ..replicas._lighthouse import Lighthouse
from ..replicas._quorum import QuorumHistory, member_group, read_quorum
from ..replicas._settings import ReplicaGroups

if TYPE_CHECKING:
    from ._job import Job

__all__ = ("GroupsView", "failure_line", "quorum_left")

log = logging.getLogger("aelastic.replicas")

#: seconds between two records
INTERVAL = 1.0


def _node_row(node: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("node", "host", "state", "step", "restart_count", "stale")
    return {k: node.get(k) for k in keys}


def _endpoint(handler: Any) -> str:
    """Where ``aelastic status`` reaches a group's store (c10d: the hosted one's bound
    port, not ``:0``)."""
    server = getattr(handler, "server", None)
    if server is not None:
        return str(server.address)
    return str(getattr(handler, "_master_endpoint", "?"))


def quorum_left(quorum: Mapping[str, Any] | None, group: int) -> str:
    """What replica group ``group`` leaves when it fails, from the last quorum read
    (:func:`read_quorum`'s): ``quorum 7 (goes on with train_0, train_2)``, or
    ``quorum 7 (it was not a member)``; ``""`` when no quorum was read."""
    if not quorum or quorum.get("quorum_id") is None:
        return ""
    members = [str(m.get("replica_id", "?")) for m in quorum.get("members") or []]
    others = [m for m in members if member_group(m) != group]
    if len(others) == len(members):
        return f"quorum {quorum['quorum_id']} (it was not a member)"
    rest = ", ".join(m.split(":", 1)[0] for m in others) or "no other group"
    return f"quorum {quorum['quorum_id']} (goes on with {rest})"


def _exit(code: int) -> str:
    """``exited 3`` or ``killed by SIGKILL``."""
    if code >= 0:
        return f"exited {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def failure_line(
    group: int,
    run_id: str,
    what: str,
    restarts_left: int | None,
    max_restarts: int,
    quorum: Mapping[str, Any] | None,
) -> str:
    """The line that says replica group ``group`` (its run ``run_id``) failed: ``what``
    (``rank 0 exited 1``), whether it restarts (``restarts_left`` after this restart;
    None: it does not, its budget is spent), and the quorum it leaves
    (:func:`quorum_left`; nothing when none was read)."""
    then = (
        "no restarts left"
        if restarts_left is None
        else f"restarting ({restarts_left}/{max_restarts} restarts left)"
    )
    left = quorum_left(quorum, group)
    return f"replica group {group} (run {run_id}) failed: {what}; {then}" + (
        f"; it leaves {left}" if left else ""
    )


class GroupsView:
    """The replica groups of this node and the quorum, as the runner sees them."""

    def __init__(self, groups: ReplicaGroups, run_id: str, lighthouse: str) -> None:
        self.groups = groups
        self.run_id = run_id
        self.lighthouse = lighthouse
        self.lighthouse_restarts = 0
        self.state = dict.fromkeys(groups.local_groups(), "starting")
        self.restarts = dict.fromkeys(groups.local_groups(), 0)  # of finished attempts
        self.replaced = dict.fromkeys(groups.local_groups(), 0)
        self.history = QuorumHistory()
        self.quorum: dict[str, Any] | None = None
        self.quorum_error: str | None = None
        self._nodes: dict[int, list[dict[str, Any]]] = {}
        self._quorum_steps: dict[int, int] = {}  # each group's last step in a quorum
        self.failures: dict[int, str] = {}  # each group's last failure line

    def failed(self, group_id: int, job: Job, restarts_left: int | None) -> str:
        """Group ``group_id``'s attempt ``job`` failed (its workers stopped): log the
        line that names the group and the quorum it leaves (:func:`failure_line`),
        record the ``aelastic.replicas.group_failed`` event to the job's event
        destination, keep it for ``aelastic status``. Return the line. Never raises."""
        failure = job.last_failure
        what = (
            "a worker failed"
            if failure is None
            else (f"rank {failure.global_rank} {_exit(failure.exitcode)}")
        )
        line = failure_line(
            group_id, job.run_id, what, restarts_left, job.config.max_restarts, self.quorum
        )
        self.failures[group_id] = line
        log.warning("%s", line)
        quorum = self.quorum or {}
        metadata: dict[str, Any] = {
            "run_id": job.run_id,
            "replica_group": group_id,
            "groups_total": self.groups.groups,
            "restarts_left": 0 if restarts_left is None else restarts_left,
            "restarting": restarts_left is not None,
            "global_rank": None if failure is None else failure.global_rank,
            "exitcode": None if failure is None else failure.exitcode,
            "quorum_id": quorum.get("quorum_id"),
            "quorum_left": quorum_left(quorum, group_id),
            "message": line,
        }
        try:
            events.record(
                events.Event(
                    "aelastic.replicas.group_failed",
                    events.EventSource.AGENT,
                    timestamp=int(time.time() * 1000),
                    metadata=metadata,
                ),
                job.config.event_log_handler,
            )
        except Exception:  # an event handler's error must not stop the runner
            log.exception("the replica group failure event was not recorded")
        return line

    def ended(self, group_id: int, job: Job, state: str) -> None:
        """Group ``group_id``'s attempt ``job`` ended: ``completed``, ``excluded`` or
        ``replaced`` (a spare runs next)."""
        self.restarts[group_id] += job.restart_count
        if state == "replaced":
            self.replaced[group_id] += 1
            state = "starting"
        self.state[group_id] = state

    def record(self, jobs: Mapping[int, Job], now: float) -> dict[str, Any]:
        """The record ``aelastic status`` reads (plain: no I/O)."""
        members = (self.quorum or {}).get("members") or []
        in_quorum = {member_group(m["replica_id"]): m for m in members}
        rows = []
        for k in self.groups.local_groups():
            job = jobs.get(k)
            state = "running" if job is not None and self.state[k] == "starting" else self.state[k]
            nodes = self._nodes.get(k, [])
            steps = [n["step"] for n in nodes if isinstance(n.get("step"), int)]
            member = in_quorum.get(k)
            if member is not None:
                self._quorum_steps[k] = member["step"]
            rows.append(
                {
                    "group": k,
                    "run_id": job.run_id if job is not None else None,
                    "state": state,
                    "restarts": self.restarts[k] + (job.restart_count if job is not None else 0),
                    "replaced": self.replaced[k],
                    # aelastic.progress's step if the workers report it, else the quorum's
                    "step": min(steps) if steps else self._quorum_steps.get(k),
                    "replica_id": member["replica_id"] if member else None,
                    "last_failure": self.failures.get(k),
                    "nodes": nodes,
                }
            )
        return {
            "run_id": self.run_id,
            "groups_total": self.groups.groups,
            "groups": rows,
            "lighthouse": self.lighthouse,
            "lighthouse_restarts": self.lighthouse_restarts,
            "quorum": self.quorum,
            "quorum_error": self.quorum_error,
            "membership": self.history.to_json(),
            "time": round(now, 2),
        }

    async def poll(self, jobs: Mapping[int, Job]) -> None:
        """Read the quorum and each running group's nodes now (each bounded)."""
        try:
            self.quorum = await read_quorum(self.lighthouse)
            self.quorum_error = None
            self.history.note(time.time(), self.quorum)
        except LighthouseError as exc:
            self.quorum_error = str(exc)
        for k, job in list(jobs.items()):
            publisher = job.status_publisher
            if publisher is None:
                continue
            with anyio.move_on_after(INTERVAL):
                try:
                    view = await publisher.read_view()
                except Exception as exc:  # not joined yet, a store error: next time
                    log.debug("replica group %d: no view yet: %s", k, exc)
                    continue
                if k not in self._nodes:
                    log.info(
                        "replica group %d: python -m aelastic status --rdzv-endpoint %s "
                        "--rdzv-id %s",
                        k,
                        _endpoint(publisher.handler),
                        job.run_id,
                    )
                self._nodes[k] = [_node_row(n) for n in view["nodes"]]

    async def publish(self, jobs: Mapping[int, Job]) -> None:
        """Write the record into every running local group's status store."""
        record = self.record(jobs, time.time())
        for job in list(jobs.values()):
            if job.status_publisher is not None:
                await publish_replicas(job.status_publisher.handler, record)

    async def run(self, jobs: Mapping[int, Job], lighthouse: Lighthouse | None = None) -> None:
        """Poll and publish every second until cancelled (``lighthouse``: the supervised
        one, whose restarts are counted). Never raises but cancellation."""
        while True:
            if lighthouse is not None:
                self.lighthouse_restarts = len(lighthouse.restarts)
            await self.poll(jobs)
            await self.publish(jobs)
            await anyio.sleep(INTERVAL)
