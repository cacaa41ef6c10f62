"""The ``run`` flags of straggler detection (``aelastic.stragglers``), and their checks.

Kept apart so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``. Every flag also reads
``PET_<NAME>`` like torchrun's own. Detection is on by default (``report``). The
defaults and the range checks are
:class:`aelastic.stragglers._settings.StragglerSettings`'s (the Python API gets the same
messages); this module only reads the flags into one.
"""

from __future__ import annotations

from typing import Any

from .._option_table import Option, OptionValues
from ..stragglers._exceptions import StragglerConfigError
from ..stragglers._settings import StragglerSettings
from ._exceptions import UsageError

__all__ = ("OPTIONS", "config_fields")

_DEFAULT = StragglerSettings()

#: (flags, dest, kind, default, help), the launcher's option table format.
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
    """``{"stragglers": StragglerSettings}`` of these flags, checked.

    Raises:
        UsageError: a value that is not a number, or one :class:`StragglerSettings`
            refuses (its message: out of range, an unknown action).
    """
    values: dict[str, Any] = {"action": v.str_("straggler_action") or _DEFAULT.action}
    for name in ("threshold", "window", "min_duration", "timeout", "warmup"):
        dest = f"straggler_{name}"
        raw = v.str_(dest)
        try:
            values[name] = float(raw)
        except (TypeError, ValueError):
            raise UsageError(f"{v.source(dest)} {raw!r}: expected a number") from None
    try:
        return {"stragglers": StragglerSettings(**values)}
    except StragglerConfigError as exc:
        raise UsageError(str(exc)) from None
