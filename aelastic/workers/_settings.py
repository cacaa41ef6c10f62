"""``PreloadSettings``: what the idle warm interpreters import before a restart, checked
once, and its ``aelastic run`` flags.

One frozen object per launch: its defaults are stated here and nowhere else, and its
check runs when it is made, so the command line (``--preload``, ``--preload-exclude``:
:data:`OPTIONS`, read into one by :func:`config_fields`) and the Python API
(``LaunchConfig(preload=PreloadSettings(modules=("torch",)))``) refuse a bad name with
the same message. The launcher's parser only appends :data:`OPTIONS` to its table; it
holds the object as ``LaunchConfig.preload`` and hands its two tuples to
:class:`aelastic.agent.WorkerSpec` (``preload``, ``preload_exclude``). Every flag also
reads ``PET_<NAME>`` like torchrun's own. No anyio, no I/O, no agent: ``aelastic run``
parses its flags before it loads the agent.
"""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass
from .._exceptions import ConfigError
from .._option_table import Option, OptionValues
from ._preload import parse_preload

__all__ = ("OPTIONS", "PreloadSettings", "config_fields")

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format. No
#: default here: an absent flag is PreloadSettings' default (nothing), told apart by
#: ``given``.
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


@dataclass(frozen=True)
class PreloadSettings:
    """What warm interpreters import before a restart (docs/preload.md).

    ``modules``: dotted module names, or ``"auto"`` (the modules the workers imported);
    ``exclude``: modules (and their submodules) never preloaded. Each takes a tuple, a
    list or one comma-separated string, kept as a tuple of distinct names in order.
    Empty ``modules`` (the default): nothing is preloaded.

    Raises:
        ConfigError: from construction, a name that is not a module name (the message
            names the flag and the fix); nothing is kept.
    """

    modules: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # parse_preload raises ConfigError naming the flag, the value and the fix
        object.__setattr__(self, "modules", _names(self.modules, "--preload"))
        object.__setattr__(self, "exclude", _names(self.exclude, "--preload-exclude"))


def _names(value: object, flag: str) -> tuple[str, ...]:
    """``value`` as a tuple of distinct module names; ConfigError naming ``flag`` if not."""
    if isinstance(value, str) or (
        isinstance(value, (tuple, list)) and all(isinstance(name, str) for name in value)
    ):
        return parse_preload(value, flag)
    raise ConfigError(
        f"{flag} {value!r}: need module names, as a tuple such as ('torch',) or one "
        "comma-separated string such as 'torch,torch.optim'"
    )


def config_fields(
    v: OptionValues, *, python: bool, replica_groups: bool, warnings: list[str]
) -> dict[str, Any]:
    """``{"preload": PreloadSettings}`` of the flags of :data:`OPTIONS`, checked.

    ``python``: the workers run Python (not ``--no-python``); without it a ``--preload``
    only adds a line to ``warnings``. ``replica_groups``: torchft replica groups are on,
    where an absent ``--preload`` means ``auto`` (a failed group's restart skips the
    imports, so it rejoins sooner).

    Raises:
        ConfigError: a name that is not a module name (PreloadSettings' message; the
            parser shows it as a usage error).
    """
    modules = v.str_("preload")
    if replica_groups and python and not v.given("preload"):
        modules = "auto"
    settings = PreloadSettings(modules=modules or (), exclude=v.str_("preload_exclude") or ())
    if settings.modules and not python:
        warnings.append("--preload has no effect with --no-python: nothing runs in Python")
    return {"preload": settings}
