"""``HealthSettings``: where the job's health and status endpoint listens, checked once,
and its ``aelastic run`` flags.

One frozen object per launch: its defaults (no endpoint; loopback when there is one)
are stated here and nowhere else, and its checks run when it is made, so the command
line (``--health-port``, ``--health-host``, torchrun's
``TORCHELASTIC_HEALTH_CHECK_PORT``: :data:`OPTIONS`, read into one by
:func:`config_fields`) and the Python API (``LaunchConfig(health=HealthSettings(port=0))``)
refuse a bad value with the same message. The launcher's parser only appends
:data:`OPTIONS` to its table; it holds the object as ``LaunchConfig.health`` and serves
the job view's ``/status`` (and ``/healthz``, ``/readyz``, ``/metrics``) there. Every
flag also reads ``PET_<NAME>`` like torchrun's own. No anyio, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._dataclass import dataclass
from .._exceptions import ConfigError
from .._option_table import Option, OptionValues

__all__ = ("OPTIONS", "HealthSettings", "config_fields")

#: torchrun's variable for the health port (``--health-port`` wins).
_HEALTH_ENV = "TORCHELASTIC_HEALTH_CHECK_PORT"


@dataclass(frozen=True)
class HealthSettings:
    """Where ``/healthz /readyz /status /metrics`` are served (docs/embedding.md).

    ``port``: None (the default), no endpoint; 0, any free port (the job tells which);
    else that TCP port. ``host``: the address it listens on, loopback unless another is
    given (a host name is served on all its addresses).

    Raises:
        ConfigError: from construction, a value that cannot work (the message names the
            flag and the fix); nothing is kept.
    """

    port: int | None = None
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        port, host = self.port, self.host
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise ConfigError(
                f"--health-port {port!r}: a TCP port is 0-65535 (0: any free port); "
                "leave it unset (None) for no health endpoint"
            )
        if not isinstance(host, str) or not host.strip():
            raise ConfigError(
                f"--health-host {host!r}: need the address to listen on, such as 127.0.0.1"
            )


_DEFAULT = HealthSettings()

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format.
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
    """``{"health": HealthSettings}`` of the flags of :data:`OPTIONS` (else
    ``TORCHELASTIC_HEALTH_CHECK_PORT`` in ``env``).

    Raises:
        ConfigError: a ``TORCHELASTIC_HEALTH_CHECK_PORT`` that is not a whole number, or
            a value HealthSettings refuses (its message: a port outside 0-65535, an empty
            host); the parser shows it as a usage error. A ``--health-port`` that is not
            a whole number: the parser's own usage error.
    """
    port = v.int_("health_port")
    if port is None and env.get(_HEALTH_ENV):
        raw = env[_HEALTH_ENV]
        try:
            port = int(raw)
        except ValueError:
            raise ConfigError(f"{_HEALTH_ENV}={raw!r}: expected a TCP port number") from None
    return {"health": HealthSettings(port=port, host=v.str_("health_host"))}
