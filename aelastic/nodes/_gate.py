"""``NodeGate``: keep this node out of the next rounds while it is excluded or unhealthy.

Before the node joins each rendezvous round, an exclusion (``--exclude-node-after``,
see :mod:`._exclusion`) is waited out, then the health checks run. An unhealthy node
does not join: it leaves the round it was in (the others regroup without it, and
with ``--nnodes MIN:MAX`` go on), says which check failed and why (a log line, an
``aelastic.node.unhealthy`` event, ``/status``, ``/readyz``), and tries again after
a cooldown. When the job ends meanwhile (its rendezvous is closed, or its store is
gone) it raises :class:`NodeUnhealthyError` (:class:`NodeExcludedError` when out
for repeated failures).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..agent import WorkerState
from ..agent._policy import Action, Decision
from ._checks import SKIPPED, HealthCheck
from ._exceptions import NodeExcludedError, NodeHealthConfigError, NodeUnhealthyError
from ._exclusion import ExclusionRecord, NodeExclusion, excluded_nodes, publish
from ._policy import CheckResult, HealthReport, report_of

if TYPE_CHECKING:
    from ..rendezvous import RendezvousHandler

__all__ = ("NodeGate",)

log = logging.getLogger("aelastic.nodes")

#: Longest wait between two looks at whether the job ended, while kept out.
_END_POLL = 2.0

Emit = Callable[[str, Mapping[str, Any]], None]


class NodeGate:
    """The checks, each bounded by ``timeout`` seconds, and the ``cooldown`` between tries.

    :attr:`report` is the last pass's :class:`HealthReport` (None before the first).

    Raises:
        NodeHealthConfigError: ``timeout`` or ``cooldown`` is not a positive number.
    """

    def __init__(
        self,
        checks: Sequence[HealthCheck],
        *,
        timeout: float = 30.0,
        cooldown: float = 30.0,
        exclusion: NodeExclusion | None = None,
    ) -> None:
        if not timeout > 0:
            raise NodeHealthConfigError(f"--node-health-timeout {timeout}: need seconds > 0")
        if not cooldown > 0:
            raise NodeHealthConfigError(f"--node-health-cooldown {cooldown}: need seconds > 0")
        self.checks = tuple(checks)
        self.timeout = timeout
        self.cooldown = cooldown
        self.report: HealthReport | None = None
        #: this node's failed rounds and exclusion (None: ``--exclude-node-after`` off)
        self.exclusion = exclusion

    @property
    def kept_out(self) -> bool:
        """Whether the last pass failed (the node is out of the rounds until one passes)."""
        return self.report is not None and not self.report.healthy

    async def check(self) -> HealthReport:
        """Run every check at once, each within :attr:`timeout`; keep and return the report.

        Never raises for a check's failure, hang or error: each is a failed result.
        Cancellation stops every check (a command's process group is killed).
        """
        results: list[CheckResult] = [CheckResult("", True)] * len(self.checks)
        async with anyio.create_task_group() as tg:
            for index, check in enumerate(self.checks):
                tg.start_soon(self._run_one, check, results, index)
        self.report = report_of(results, time.time(), self.report)
        return self.report

    async def _run_one(self, check: HealthCheck, out: list[CheckResult], index: int) -> None:
        started = time.monotonic()
        with anyio.move_on_after(self.timeout) as scope:
            try:
                ok, detail = await check.run()
            except Exception as exc:
                ok, detail = False, f"raised {type(exc).__name__}: {exc}"
        if scope.cancelled_caught:
            ok, detail = False, f"timed out after {self.timeout:g} s (--node-health-timeout)"
        skipped = ok and detail.startswith(SKIPPED)
        if skipped:
            detail = detail[len(SKIPPED) :]
        out[index] = CheckResult(check.name, ok, detail, skipped, time.monotonic() - started)

    async def admit(self, handler: RendezvousHandler, emit: Emit) -> None:
        """Return once a pass is healthy; meanwhile stay out of the rounds.

        The first failed pass makes this node leave the round it is in
        (``handler.shutdown()``, which does not close the rendezvous). ``emit(name,
        metadata)`` records ``aelastic.node.unhealthy`` for each failed pass and
        ``aelastic.node.healthy`` when a pass succeeds after one failed.

        Raises:
            NodeUnhealthyError: the job ended while this node was kept out (its
                rendezvous was closed, or its store cannot be reached).
            NodeExcludedError: the same while it was excluded for repeated failures.
        """
        await self._sit_out_exclusion(handler, emit)
        if not self.checks:
            return
        report = await self.check()
        if report.healthy:
            return
        left = False
        while not report.healthy:
            failed = report.failed
            log.error(
                "node health check failed (%d time(s) in a row): %s; not joining the next "
                "round, trying again in %g s",
                report.strikes,
                report.reason(),
                self.cooldown,
            )
            emit(
                "aelastic.node.unhealthy",
                {
                    "checks": ",".join(r.name for r in failed),
                    "reason": report.reason(),
                    "strikes": report.strikes,
                    "cooldown": self.cooldown,
                },
            )
            if not left:
                left = True
                await handler.shutdown()
            strikes = report.strikes
            ended = await self._wait_cooldown(handler, self.cooldown)
            if ended:
                raise NodeUnhealthyError(
                    f"this node failed its health checks ({report.reason()}) and stayed out"
                    f" of the job, which went on without it and then ended ({ended});"
                    " repair or replace this host",
                    tuple(r.name for r in failed),
                )
            report = await self.check()
        log.warning("node health checks pass again after %d failed pass(es); rejoining", strikes)
        emit("aelastic.node.healthy", {"checks": ",".join(r.name for r in report.results)})

    async def _sit_out_exclusion(self, handler: RendezvousHandler, emit: Emit) -> None:
        """Leave the round and wait while this node is excluded (no-op when it is not)."""
        exclusion = self.exclusion
        if exclusion is None:
            return
        left = exclusion.remaining(anyio.current_time())
        if left <= 0:
            return
        record = exclusion.last
        assert record is not None
        log.error("%s; out of the next rounds for %.1f s", record.describe(), left)
        await handler.shutdown()
        ended = await self._wait_cooldown(handler, left)
        if ended:
            raise NodeExcludedError(
                f"this node was excluded from the job ({record.describe()}), which went on "
                f"without it and then ended ({ended}); repair or replace this host",
                ("excluded",),
            )
        log.warning("exclusion of %s over; rejoining the job", record.node)
        emit("aelastic.node.readmitted", {"node": record.node, "times": record.times})

    async def review(
        self,
        decision: Decision,
        remaining_restarts: int,
        why: str,
        handler: RendezvousHandler,
        emit: Emit,
    ) -> Decision:
        """Count a failed round of this node; exclude it when the threshold is reached.

        ``decision`` is the agent's (a RESTART or FAIL counts as a failure of this
        node's workers); ``remaining_restarts`` the budget before it. An exclusion
        turns it into a restart that spends nothing (this node's failures stop counting
        against the budget, and a spent budget no longer ends the job): the node then
        sits out its cooldown in :meth:`admit`. The decision is logged, recorded as
        an ``aelastic.node.excluded`` event and published in the rendezvous store.
        """
        exclusion = self.exclusion
        if exclusion is None or decision.action not in (Action.RESTART, Action.FAIL):
            return decision
        now = anyio.current_time()
        if exclusion.remaining(now) > 0:  # excluded meanwhile (a straggler): its workers
            return Decision(Action.RESTART, WorkerState.FAILED, remaining_restarts)  # were stopped
        record = exclusion.note_failure(now, why)
        if record is None:
            return decision
        await self._announce(record, handler, emit)
        return Decision(Action.RESTART, WorkerState.FAILED, remaining_restarts)

    async def exclude(self, reason: str, handler: RendezvousHandler, emit: Emit) -> bool:
        """Exclude this node now for ``reason`` (a straggler): announced as after repeated
        failures (log, ``aelastic.node.excluded``, the store's list); the caller then
        stops the workers, and :meth:`review` turns their failure into a free restart
        that sits out the cooldown. Returns False when exclusion is off (no
        :class:`NodeExclusion`). Store requests are bounded."""
        exclusion = self.exclusion
        if exclusion is None:
            return False
        record = exclusion.exclude_now(anyio.current_time(), reason)
        await self._announce(record, handler, emit)
        return True

    async def _announce(
        self, record: ExclusionRecord, handler: RendezvousHandler, emit: Emit
    ) -> None:
        log.error("excluding this node: %s", record.describe())
        emit(
            "aelastic.node.excluded",
            {
                "node": record.node,
                "times": record.times,
                "cooldown": record.cooldown,
                "reason": record.reason,
            },
        )
        await publish(handler, record)

    async def notes(self, handler: RendezvousHandler) -> list[str]:
        """The job's exclusions so far, one line each (for the failure summary; bounded)."""
        if self.exclusion is None:
            return []
        return [record.describe() for record in await excluded_nodes(handler)]

    async def _wait_cooldown(self, handler: RendezvousHandler, seconds: float) -> str:
        """Sleep ``seconds``, looking every few seconds whether the job ended.

        Returns why it ended, or "" when the time passed with the job still on.
        """
        deadline = anyio.current_time() + seconds
        while True:
            try:
                if await handler.is_closed():
                    return "its rendezvous was closed"
            except Exception as exc:
                return f"its rendezvous cannot be reached: {exc}"
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return ""
            await anyio.sleep(min(remaining, _END_POLL))
