"""The ``run`` flags of preloading (``--preload``, ``--preload-exclude``), read into one
:class:`aelastic.workers._settings.PreloadSettings`.

Kept apart so the launcher's argument module only appends :data:`OPTIONS` to its table
and passes :func:`config_fields` to ``LaunchConfig``. The names' check is the settings'
(the Python API gets the same message); this module reads the flags, adds the one
default that depends on other flags (``auto`` for replica groups) and the warning for
``--no-python``. Every flag also reads ``PET_<NAME>`` like torchrun's own.
"""

from __future__ import annotations

from typing import Any

from .._exceptions import ConfigError
from ..workers._settings import PreloadSettings
from ._exceptions import UsageError
from ._option_table import Option, OptionValues

__all__ = ("OPTIONS", "config_fields")

#: (flags, dest, kind, default, help), the launcher's option table format. No default
#: here: an absent flag is PreloadSettings' default (nothing), told apart by ``given``.
OPTIONS: tuple[Option, ...] = (
    (
        ("--preload",),
        "preload",
        "str",
        None,
        "modules the idle worker interpreters import before a restart (comma-separated),"
        " or auto: the modules the workers imported (Python script/-m workers only)",
    ),
    (
        ("--preload-exclude", "--preload_exclude"),
        "preload_exclude",
        "str",
        None,
        "modules (and their submodules) never preloaded, comma-separated",
    ),
)


def config_fields(
    v: OptionValues, *, python: bool, replica_groups: bool, warnings: list[str]
) -> dict[str, Any]:
    """``{"preload": PreloadSettings}`` of these flags, checked.

    ``python``: the workers run Python (not ``--no-python``); without it a ``--preload``
    only adds a line to ``warnings``. ``replica_groups``: torchft replica groups are on,
    where an absent ``--preload`` means ``auto`` (a failed group's restart skips the
    imports, so it rejoins sooner).

    Raises:
        UsageError: a name that is not a module name (PreloadSettings' message).
    """
    modules = v.str_("preload")
    if replica_groups and python and not v.given("preload"):
        modules = "auto"
    try:
        settings = PreloadSettings(modules=modules or (), exclude=v.str_("preload_exclude") or ())
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if settings.modules and not python:
        warnings.append("--preload has no effect with --no-python: nothing runs in Python")
    return {"preload": settings}
