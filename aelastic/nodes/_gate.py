"""``NodeGate``: run this node's health checks before it joins each rendezvous round.

An unhealthy node does not join: it leaves the round it was in (the others regroup
without it, and with ``--nnodes MIN:MAX`` go on), says which check failed and why
(a log line, an ``aelastic.node.unhealthy`` event, ``/status``, ``/readyz``), and tries
again after a cooldown. When the job ends meanwhile (its rendezvous is closed, or
its store is gone) it raises :class:`NodeUnhealthyError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ._checks import SKIPPED, HealthCheck
from ._exceptions import NodeHealthConfigError, NodeUnhealthyError
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
        self, checks: Sequence[HealthCheck], *, timeout: float = 30.0, cooldown: float = 30.0
    ) -> None:
        if not timeout > 0:
            raise NodeHealthConfigError(f"--node-health-timeout {timeout}: need seconds > 0")
        if not cooldown > 0:
            raise NodeHealthConfigError(f"--node-health-cooldown {cooldown}: need seconds > 0")
        self.checks = tuple(checks)
        self.timeout = timeout
        self.cooldown = cooldown
        self.report: HealthReport | None = None

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
        """
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
            ended = await self._wait_cooldown(handler)
            if ended:
                raise NodeUnhealthyError(
                    f"this node failed its health checks ({report.reason()}) and stayed out"
                    f" of the job, which went on without it and then ended ({ended});"
                    " repair or replace this host",
                    tuple(r.name for r in failed),
                )
            report = await self.check()
        log.warning("node health checks pass again after %d failed pass(es); rejoining", left)
        emit("aelastic.node.healthy", {"checks": ",".join(r.name for r in report.results)})

    async def _wait_cooldown(self, handler: RendezvousHandler) -> str:
        """Sleep the cooldown, looking every few seconds whether the job ended.

        Returns why it ended, or "" when the cooldown passed with the job still on.
        """
        deadline = anyio.current_time() + self.cooldown
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
