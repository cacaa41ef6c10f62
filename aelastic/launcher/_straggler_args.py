"""The ``run`` flags of straggler detection (``aelastic.stragglers``), and their checks.

Kept apart so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``. Every flag also reads
``PET_<NAME>`` like torchrun's own. Detection is on by default (``report``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._exceptions import UsageError
from ._option_table import Option, OptionValues

if TYPE_CHECKING:
    from ..stragglers._policy import StragglerSettings

__all__ = ("OPTIONS", "config_fields", "settings_of")

#: (flags, dest, kind, default, help), the launcher's option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--straggler-action",),
        "straggler_action",
        "str",
        "report",
        "what to do with a slow node found while the job runs (aelastic.stragglers): report "
        "(log 'straggler:', event, status, metrics), exclude (also take it out after "
        "--straggler-timeout; a spare takes its place) or off",
    ),
    (
        ("--straggler-threshold",),
        "straggler_threshold",
        "str",
        "0.75",
        "a rank is slow below this score (fastest rank's time per step / its own; 0 < x < 1)",
    ),
    (
        ("--straggler-window",),
        "straggler_window",
        "str",
        "10",
        "seconds of samples whose median scores a rank (sampled every window/10, 0.1-1 s)",
    ),
    (
        ("--straggler-min-duration",),
        "straggler_min_duration",
        "str",
        "20",
        "seconds a score must stay below the threshold before the rank is reported",
    ),
    (
        ("--straggler-warmup",),
        "straggler_warmup",
        "str",
        "60",
        "seconds after the workers start before their ranks are scored (start-up is uneven)",
    ),
    (
        ("--straggler-timeout",),
        "straggler_timeout",
        "str",
        "120",
        "with --straggler-action exclude: seconds a reported slowdown lasts before the node "
        "is excluded",
    ),
)


def config_fields(v: OptionValues) -> dict[str, Any]:
    """The ``LaunchConfig`` fields of these flags, checked.

    Raises:
        UsageError: a value that is not a number, out of range, or an unknown action.
    """
    from ..stragglers._exceptions import StragglerConfigError

    fields: dict[str, Any] = {"straggler_action": v.str_("straggler_action") or "report"}
    for name in ("threshold", "window", "min_duration", "timeout", "warmup"):
        dest = f"straggler_{name}"
        raw = v.str_(dest)
        try:
            fields[dest] = float(raw)
        except (TypeError, ValueError):
            raise UsageError(f"{v.source(dest)} {raw!r}: expected a number") from None
    try:
        settings_of(fields)
    except StragglerConfigError as exc:
        raise UsageError(str(exc)) from None
    return fields


def settings_of(fields: Any) -> StragglerSettings:
    """The :class:`aelastic.stragglers._policy.StragglerSettings` of ``straggler_*`` values (a
    mapping or a ``LaunchConfig``). Raises ``StragglerConfigError`` when out of range."""
    from ..stragglers._policy import StragglerSettings

    def get(name: str) -> Any:
        return fields[name] if isinstance(fields, dict) else getattr(fields, name)

    return StragglerSettings(
        action=get("straggler_action"),
        threshold=get("straggler_threshold"),
        window=get("straggler_window"),
        min_duration=get("straggler_min_duration"),
        timeout=get("straggler_timeout"),
        warmup=get("straggler_warmup"),
    )
