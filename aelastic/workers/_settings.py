"""``PreloadSettings``: what the idle warm interpreters import before a restart, checked once.

One frozen object per launch: its defaults are stated here and nowhere else, and its
check runs when it is made, so the command line (``--preload``, ``--preload-exclude``:
``aelastic.launcher._preload_args`` reads the flags into one) and the Python API
(``LaunchConfig(preload=PreloadSettings(modules=("torch",)))``) refuse a bad name with
the same message. The launcher holds it as ``LaunchConfig.preload`` and hands its two
tuples to :class:`aelastic.agent.WorkerSpec` (``preload``, ``preload_exclude``). No
anyio, no I/O, no agent: ``aelastic run`` parses its flags before it loads the agent.
"""

from __future__ import annotations

from .._dataclass import dataclass
from .._exceptions import ConfigError
from ._preload import parse_preload

__all__ = ("PreloadSettings",)


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
