"""The settings of the etcd rendezvous: the timing keys of ``--rdzv-conf`` and the client's
connection keys, read from the rendezvous parameters."""

from __future__ import annotations

import math
from typing import Any

from ..._dataclass import dataclass
from .._exceptions import RendezvousConfigError
from .._waiting import WAIT_REPORT_INTERVAL
from ._client import EtcdConfig, parse_endpoints

__all__ = ("EtcdRendezvousSettings", "settings_from_params")


@dataclass(frozen=True)
class EtcdRendezvousSettings:
    """The timing keys of ``--rdzv-conf`` (seconds), as the c10d backend reads them."""

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    prefix: str = "/aelastic/rdzv"
    #: Seconds between two "still waiting for peers" lines while joining.
    wait_report_interval: float = WAIT_REPORT_INTERVAL

    @property
    def lease_ttl(self) -> int:
        """A node is gone once etcd has not heard from it for this many seconds."""
        return max(2, math.ceil(self.keep_alive_interval * self.keep_alive_max_attempt))


def settings_from_params(params: Any) -> tuple[EtcdConfig, EtcdRendezvousSettings]:
    """The client config and the rendezvous settings in ``params``
    (:class:`~aelastic.rendezvous.RendezvousParameters`: the endpoint and ``--rdzv-conf``).

    Raises:
        RendezvousConfigError: a key or the endpoint is malformed (the message names it).
    """

    def text(*names: str) -> str | None:
        for name in names:
            value = params.get(name)
            if value is not None and str(value) != "":
                return str(value)
        return None

    def positive(name: str, default: float) -> float:
        value = params.get_as_float(name, default) if hasattr(params, "get_as_float") else None
        if value is None:
            raw = params.get(name, default)
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise RendezvousConfigError(
                    f"rendezvous config {name}={raw!r} is not a number"
                ) from None
        if not value > 0:
            raise RendezvousConfigError(
                f"rendezvous config {name}={value!r} must be a positive number"
            )
        return float(value)

    if not params.endpoint:
        raise RendezvousConfigError(
            "the etcd rendezvous needs --rdzv-endpoint host:port[,host:port...] (etcd's "
            "client URL; default port 2379)"
        )
    try:
        endpoints = parse_endpoints(params.endpoint)
    except ValueError as exc:
        raise RendezvousConfigError(f"--rdzv-endpoint {params.endpoint!r}: {exc}") from None
    protocol = (text("protocol") or "http").lower()
    config = EtcdConfig(
        endpoints=tuple(endpoints),
        protocol=protocol,
        cacert=text("cacert", "ca_cert"),
        cert=text("cert", "ssl_cert"),
        key=text("key", "ssl_cert_key"),
        username=text("username", "user"),
        password=text("password"),
        read_timeout=positive("read_timeout", 60.0),
    )
    attempts = positive("keep_alive_max_attempt", 3)
    settings = EtcdRendezvousSettings(
        join_timeout=positive("join_timeout", 600.0),
        last_call_timeout=float(params.get("last_call_timeout", 30.0) or 0.0),
        close_timeout=positive("close_timeout", 30.0),
        keep_alive_interval=positive("keep_alive_interval", 5.0),
        keep_alive_max_attempt=int(attempts),
        prefix="/" + (text("etcd_prefix") or "/aelastic/rdzv").strip("/"),
        wait_report_interval=positive("wait_report_interval", WAIT_REPORT_INTERVAL),
    )
    if settings.last_call_timeout < 0:
        raise RendezvousConfigError("rendezvous config last_call_timeout must be >= 0")
    return config, settings
