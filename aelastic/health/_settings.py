"""``HealthSettings``: where the job's health and status endpoint listens, checked once.

One frozen object per launch: its defaults (no endpoint; loopback when there is one)
are stated here and nowhere else, and its checks run when it is made, so the command
line (``--health-port``, ``--health-host``, torchrun's
``TORCHELASTIC_HEALTH_CHECK_PORT``: ``aelastic.launcher._health_args`` reads them into
one) and the Python API (``LaunchConfig(health=HealthSettings(port=0))``) refuse a bad
value with the same message. The launcher holds it as ``LaunchConfig.health`` and serves
the job view's ``/status`` (and ``/healthz``, ``/readyz``, ``/metrics``) there. No anyio,
no I/O.
"""

from __future__ import annotations

from .._dataclass import dataclass
from .._exceptions import ConfigError

__all__ = ("HealthSettings",)


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
