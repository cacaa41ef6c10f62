"""Plain decisions of the node gate: what a set of check results means, how long to wait.

No I/O, no awaiting: the async shell (:mod:`._gate`) runs the checks and acts on these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .._dataclass import dataclass

__all__ = ("CheckResult", "HealthReport", "backoff_seconds", "report_of")


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``ok``, ``skipped`` (could not apply here, counts as ok),
    ``detail`` (why it failed, what it saw, or why it was skipped) and its duration."""

    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False
    seconds: float = 0.0

    def describe(self) -> str:
        state = "skipped" if self.skipped else "ok" if self.ok else "FAILED"
        return f"{self.name}: {state}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class HealthReport:
    """Every check's result of one gate pass, and when it ran (``time.time()``)."""

    results: tuple[CheckResult, ...]
    checked_at: float
    #: consecutive unhealthy passes, this one included (0: healthy)
    strikes: int = 0

    @property
    def healthy(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    def reason(self) -> str:
        """One line naming every failed check and why (empty when healthy)."""
        return "; ".join(r.describe() for r in self.failed)

    def as_dict(self) -> dict[str, object]:
        """The ``/status`` form."""
        return {
            "healthy": self.healthy,
            "checked_at": self.checked_at,
            "strikes": self.strikes,
            "checks": [
                {
                    "name": r.name,
                    "ok": r.ok,
                    "skipped": r.skipped,
                    "detail": r.detail,
                    "seconds": round(r.seconds, 3),
                }
                for r in self.results
            ],
        }


def report_of(
    results: Sequence[CheckResult], checked_at: float, previous: HealthReport | None
) -> HealthReport:
    """The report of a pass: counts consecutive unhealthy passes from ``previous``."""
    report = HealthReport(tuple(results), checked_at)
    if report.healthy:
        return report
    strikes = (previous.strikes if previous is not None else 0) + 1
    return HealthReport(report.results, checked_at, strikes)


def backoff_seconds(base: float, times: int, cap: float) -> float:
    """``base`` doubled for each repeat after the first (``times`` >= 1), at most ``cap``."""
    if times <= 1 or base <= 0:
        return min(base, cap)
    exponent = min(times - 1, 62)
    return min(cap, base * math.pow(2.0, exponent))


@dataclass(frozen=True)
class ExclusionSettings:
    """``--exclude-node-after N`` failed rounds within ``window`` seconds keep the node
    out for ``cooldown`` seconds, doubled on each repeat, at most ``cooldown_max``."""

    after: int
    window: float = 3600.0
    cooldown: float = 300.0
    cooldown_max: float = 3600.0


def failures_in_window(times: Sequence[float], now: float, window: float) -> list[float]:
    """The failure times (monotonic seconds) no older than ``window`` at ``now``."""
    return [t for t in times if now - t <= window]


def should_exclude(times: Sequence[float], now: float, settings: ExclusionSettings) -> bool:
    """Whether the failures in ``times`` (this one included) reach the threshold."""
    return settings.after > 0 and len(failures_in_window(times, now, settings.window)) >= (
        settings.after
    )
