"""Rendezvous parameters (``--rdzv-backend/-endpoint/-conf``) and endpoint parsing."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any, TypeVar

from ._exceptions import RendezvousConfigError

__all__ = ("RendezvousParameters", "parse_endpoint", "DEFAULT_C10D_PORT")

#: The port of a c10d rendezvous endpoint given without one (torch's default).
DEFAULT_C10D_PORT = 29400

_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"0", "false", "f", "no", "n"})

_N = TypeVar("_N", int, float)


class RendezvousParameters:
    """Everything a backend needs to build a handler.

    ``config`` holds the backend-specific keys (``--rdzv-conf``); unknown keys are kept
    and ignored by backends that do not read them. Validation errors raise
    :class:`RendezvousConfigError` (a ValueError) naming the offending value and the fix.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **config: Any,
    ) -> None:
        if not isinstance(backend, str) or not backend.strip():
            raise RendezvousConfigError(
                "the rendezvous backend must be a non-empty string (e.g. 'c10d')"
            )
        if not isinstance(run_id, str) or not run_id.strip():
            raise RendezvousConfigError(
                "the rendezvous run_id must be a non-empty string shared by all nodes"
            )
        if "/" in run_id or any(c.isspace() for c in run_id):
            raise RendezvousConfigError(f"run_id {run_id!r} must not contain '/' or whitespace")
        if not isinstance(min_nodes, int) or isinstance(min_nodes, bool) or min_nodes < 1:
            raise RendezvousConfigError(f"min_nodes ({min_nodes!r}) must be an integer >= 1")
        if not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1:
            raise RendezvousConfigError(f"max_nodes ({max_nodes!r}) must be an integer >= 1")
        if min_nodes > max_nodes:
            raise RendezvousConfigError(
                f"min_nodes ({min_nodes}) must not exceed max_nodes ({max_nodes})"
            )
        self.backend = backend.strip()
        self.endpoint = (endpoint or "").strip()
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config: dict[str, Any] = dict(config)

    def __repr__(self) -> str:
        return (
            f"RendezvousParameters(backend={self.backend!r}, endpoint={self.endpoint!r}, "
            f"run_id={self.run_id!r}, min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
            f"local_addr={self.local_addr!r}, config={self.config!r})"
        )

    def get(self, key: str, default: Any = None) -> Any:
        """Return the value of config ``key``, or ``default`` if it is not set."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Return config ``key`` as a bool (1/0, true/false, t/f, yes/no, y/n)."""
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        raise RendezvousConfigError(
            f"rendezvous config {key}={value!r} is not a boolean; use one of "
            "1/0, true/false, t/f, yes/no, y/n"
        )

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """Return config ``key`` as an int."""
        return self._get_as(key, default, int, "an integer", "10")

    def get_as_float(self, key: str, default: float | None = None) -> float | None:
        """Return config ``key`` as a float (timeouts may be fractional seconds)."""
        return self._get_as(key, default, float, "a number", "30")

    def _get_as(
        self, key: str, default: _N | None, convert: Callable[[Any], _N], what: str, example: str
    ) -> _N | None:
        """Return config ``key`` through ``convert`` (bools refused) or raise a config error."""
        value = self.get(key, default)
        if value is None:
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            return convert(value)
        except (TypeError, ValueError):
            raise RendezvousConfigError(
                f"rendezvous config {key}={value!r} is not {what}; pass e.g. {key}={example}"
            ) from None

    def get_positive_float(self, key: str, default: float) -> float:
        """Return config ``key`` as a float > 0; RendezvousConfigError otherwise."""
        value = self.get_as_float(key, default)
        assert value is not None
        if not value > 0:
            raise RendezvousConfigError(
                f"rendezvous config {key}={value!r} must be a positive number"
            )
        return value


#: A host name or IPv4 address, as torch's ``parse_rendezvous_endpoint`` accepts it.
_HOST_NAME = re.compile(r"[\w.-]+")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text.split("%", 1)[0])  # a zone (%eth0) may follow
    except ValueError:
        return False
    return True


def parse_endpoint(endpoint: str, default_port: int | None) -> tuple[str, int]:
    """Split ``host[:port]`` or ``[ipv6]:port`` into ``(host, port)``.

    Accepts and refuses what torch's ``parse_rendezvous_endpoint`` does: an empty
    endpoint is ``localhost`` on ``default_port``; a host name is letters, digits,
    ``.``, ``-`` and ``_`` (so ``~`` or ``"host :123"`` are refused) and a ``:`` must be
    followed by a port.

    Raises :class:`RendezvousConfigError` naming the endpoint when it is malformed or has no
    port and ``default_port`` is None.
    """
    text = endpoint.strip()
    if not text:
        if default_port is None:
            raise RendezvousConfigError(
                "the rendezvous endpoint is empty; pass --rdzv-endpoint host:port"
            )
        return "localhost", default_port
    host: str
    port_text: str | None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise RendezvousConfigError(
                f"rendezvous endpoint {endpoint!r}: missing ']' after IPv6 host"
            )
        host = text[1:close]
        if not _is_ipv6(host):
            raise RendezvousConfigError(
                f"rendezvous endpoint {endpoint!r}: {host!r} in brackets is not an IPv6 address"
            )
        rest = text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise RendezvousConfigError(
                f"rendezvous endpoint {endpoint!r}: expected ':port' after ']'"
            )
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        # A bare IPv6 address without a port; anything else with several ':' is a typo
        # that would otherwise be retried as a host name until the connect timeout.
        if not _is_ipv6(text):
            raise RendezvousConfigError(
                f"rendezvous endpoint {endpoint!r} is not host:port (it has several ':' and "
                "is not an IPv6 address); pass host:port, or [ipv6]:port"
            )
        host, port_text = text, None
    else:
        host, _, port_text = text.partition(":")
        if not _:
            port_text = None
    if not host:
        raise RendezvousConfigError(f"rendezvous endpoint {endpoint!r} has no host")
    if not _HOST_NAME.fullmatch(host) and not _is_ipv6(host):
        raise RendezvousConfigError(
            f"rendezvous endpoint {endpoint!r}: host {host!r} is not a host name or an IP"
            " address (letters, digits, '.', '-' and '_' only); pass host:port"
        )
    if port_text == "":
        raise RendezvousConfigError(
            f"rendezvous endpoint {endpoint!r} ends with ':' but names no port; pass"
            f" host:port (e.g. {host}:29500) or the host alone"
        )
    if port_text is None:
        if default_port is None:
            raise RendezvousConfigError(
                f"rendezvous endpoint {endpoint!r} has no port; pass host:port (e.g. {host}:29500)"
            )
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise RendezvousConfigError(
            f"rendezvous endpoint {endpoint!r}: port {port_text!r} is not a number"
        ) from None
    if not 0 <= port <= 65535:
        raise RendezvousConfigError(
            f"rendezvous endpoint {endpoint!r}: port {port} is out of range"
        )
    return host, port
