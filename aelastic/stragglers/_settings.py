"""``StragglerSettings``: the ``--straggler-*`` values of a launch, checked once, and
their ``aelastic run`` flags.

One frozen object per launch: its defaults are stated here and nowhere else, and its
checks run when it is made, so the command line (:data:`OPTIONS`, read into one by
:func:`config_fields`) and the Python API
(``LaunchConfig(stragglers=StragglerSettings(...))``) refuse a bad value with the same
message. The launcher's parser only appends :data:`OPTIONS` to its table; it holds the
object as ``LaunchConfig.stragglers`` and hands it as it is to
:class:`aelastic.stragglers._watch.StragglerWatch`. Every flag also reads
``PET_<NAME>`` like torchrun's own; detection is on by default (``report``). Kept apart
from the scoring in :mod:`._policy` so that ``LaunchConfig`` can hold it without
importing ``statistics`` (about 50 ms of every ``aelastic run``).
"""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass
from .._option_table import Option, OptionValues
from ._exceptions import StragglerConfigError

__all__ = ("ACTIONS", "OPTIONS", "StragglerSettings", "config_fields")

#: What to do with a confirmed straggler: ``report`` (default), ``exclude``, ``off``.
ACTIONS = ("report", "exclude", "off")


@dataclass(frozen=True)
class StragglerSettings:
    """``--straggler-*``: the action, the score threshold, the window whose median scores
    a rank, how long a score must stay low before it is reported (``min_duration``), and
    how long before a slow node is excluded (``timeout``, action ``exclude``), and how
    long after its workers start a node's ranks are not scored (``warmup``: imports and
    process-group setup take each rank a different time, and nothing is in lockstep
    yet). Samples are taken every :attr:`interval` seconds (a tenth of the window, 0.1
    to 1 s); a node is excluded at most once per set of workers and once per
    :attr:`exclude_backoff` seconds.

    Raises:
        StragglerConfigError: a value out of range (see :meth:`check`).
    """

    action: str = "report"
    threshold: float = 0.75
    window: float = 10.0
    min_duration: float = 20.0
    timeout: float = 120.0
    warmup: float = 60.0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        if self.action not in ACTIONS:
            raise StragglerConfigError(
                f"--straggler-action {self.action!r}: choose one of {', '.join(ACTIONS)}"
            )
        if not 0.0 < self.threshold < 1.0:
            raise StragglerConfigError(
                f"--straggler-threshold {self.threshold}: need a score strictly between 0 and"
                " 1 (0.75: a rank is slow at 1.33x the fastest rank's time per step)"
            )
        for name, value in (("window", self.window), ("min-duration", self.min_duration)):
            if not value > 0:
                raise StragglerConfigError(f"--straggler-{name} {value}: need seconds > 0")
        for name, value in (("timeout", self.timeout), ("warmup", self.warmup)):
            if not value >= 0:
                raise StragglerConfigError(f"--straggler-{name} {value}: need seconds >= 0")

    @property
    def enabled(self) -> bool:
        return self.action != "off"

    @property
    def interval(self) -> float:
        """Seconds between two samples: a tenth of the window, within 0.1 to 1 s."""
        return min(1.0, max(0.1, self.window / 10))

    @property
    def exclude_backoff(self) -> float:
        """Least seconds between two exclusions of one node (action ``exclude``):
        ``warmup + min_duration + timeout``, the time new workers take to be scored,
        confirmed slow and excluded (200 s by default). See :mod:`._exclude`."""
        return self.warmup + self.min_duration + self.timeout


_DEFAULT = StragglerSettings()

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--straggler-action",),
        "straggler_action",
        "str",
        _DEFAULT.action,
        "what to do with a slow node found while the job runs (aelastic.stragglers): report "
        "(log 'straggler:', event, status, metrics), exclude (also take it out after "
        "--straggler-timeout; a spare takes its place) or off",
    ),
    (
        ("--straggler-threshold",),
        "straggler_threshold",
        "str",
        f"{_DEFAULT.threshold:g}",
        "a rank is slow below this score (fastest rank's time per step / its own; 0 < x < 1)",
    ),
    (
        ("--straggler-window",),
        "straggler_window",
        "str",
        f"{_DEFAULT.window:g}",
        "seconds of samples whose median scores a rank (sampled every window/10, 0.1-1 s)",
    ),
    (
        ("--straggler-min-duration",),
        "straggler_min_duration",
        "str",
        f"{_DEFAULT.min_duration:g}",
        "seconds a score must stay below the threshold before the rank is reported",
    ),
    (
        ("--straggler-warmup",),
        "straggler_warmup",
        "str",
        f"{_DEFAULT.warmup:g}",
        "seconds after the workers start before their ranks are scored (start-up is uneven)",
    ),
    (
        ("--straggler-timeout",),
        "straggler_timeout",
        "str",
        f"{_DEFAULT.timeout:g}",
        "with --straggler-action exclude: seconds a reported slowdown lasts before the node "
        "is excluded",
    ),
)


def config_fields(v: OptionValues) -> dict[str, Any]:
    """``{"stragglers": StragglerSettings}`` of the flags of :data:`OPTIONS`, checked.

    Raises:
        StragglerConfigError: a value that is not a number, or one
            :class:`StragglerSettings` refuses (its message: out of range, an unknown
            action); the parser shows it as a usage error.
    """
    values: dict[str, Any] = {"action": v.str_("straggler_action") or _DEFAULT.action}
    for name in ("threshold", "window", "min_duration", "timeout", "warmup"):
        dest = f"straggler_{name}"
        raw = v.str_(dest)
        try:
            values[name] = float(raw)
        except (TypeError, ValueError):
            raise StragglerConfigError(f"{v.source(dest)} {raw!r}: expected a number") from None
    return {"stragglers": StragglerSettings(**values)}
