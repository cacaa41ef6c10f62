"""The ``run`` flags of the health and status endpoint (``--health-port``,
``--health-host``), read into one :class:`aelastic.health._settings.HealthSettings`.

Kept apart so the launcher's argument module only appends :data:`OPTIONS` to its table
and passes :func:`config_fields` to ``LaunchConfig``. The defaults and range checks are
the settings' (the Python API gets the same messages); this module reads the flags, and
torchrun's ``TORCHELASTIC_HEALTH_CHECK_PORT`` when ``--health-port`` is not given. Every
flag also reads ``PET_<NAME>`` like torchrun's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import ConfigError
from .._option_table import Option, OptionValues
from ..health._settings import HealthSettings
from ._exceptions import UsageError

__all__ = ("OPTIONS", "config_fields")

#: torchrun's variable for the health port (``--health-port`` wins).
_HEALTH_ENV = "TORCHELASTIC_HEALTH_CHECK_PORT"
_DEFAULT = HealthSettings()

#: (flags, dest, kind, default, help), the launcher's option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--health-port", "--health_port"),
        "health_port",
        "str",
        None,
        "serve /healthz /readyz /status /metrics on this port (0: any free port; "
        f"else ${_HEALTH_ENV}; unset: no endpoint)",
    ),
    (
        ("--health-host", "--health_host"),
        "health_host",
        "str",
        _DEFAULT.host,
        "address the health endpoint listens on",
    ),
)


def config_fields(v: OptionValues, env: Mapping[str, str]) -> dict[str, Any]:
    """``{"health": HealthSettings}`` of these flags (else ``TORCHELASTIC_HEALTH_CHECK_PORT``).

    Raises:
        UsageError: a port that is not a whole number, or a value HealthSettings refuses
            (its message: a port outside 0-65535, an empty host).
    """
    port = v.int_("health_port")
    if port is None and env.get(_HEALTH_ENV):
        raw = env[_HEALTH_ENV]
        try:
            port = int(raw)
        except ValueError:
            raise UsageError(f"{_HEALTH_ENV}={raw!r}: expected a TCP port number") from None
    try:
        return {"health": HealthSettings(port=port, host=v.str_("health_host"))}
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
