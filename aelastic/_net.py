"""Address helpers shared by the store, the agent and the rendezvous backends."""

from __future__ import annotations

import functools
import socket

__all__ = ("free_port", "is_loopback", "node_name")


@functools.lru_cache(maxsize=1)
def node_name() -> str:
    """This machine's name as every report gives it (failure summary, ``/status``, logs).

    ``socket.gethostname()``, read once per process: no DNS round trip (torchrun's
    #73656), and not ``getfqdn()``, which answers ``localhost`` on a host whose name is
    an alias of 127.0.0.1.
    """
    return socket.gethostname()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``).

    Names other than ``localhost`` are not resolved: an unresolvable or remote name is
    simply not loopback. ``[::1]``-style brackets are accepted.
    """
    if host == "localhost":
        return True
    import ipaddress  # off the launch path unless an address is actually checked

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def free_port(host: str = "localhost") -> int:
    """A TCP port free on ``host`` now (bound to port 0, then released; torch's
    ``_get_socket_with_port``). Another process may take it before it is used.

    Raises:
        OSError: no socket can be bound on ``host``.
    """
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, 0, socket.AF_UNSPEC, socket.SOCK_STREAM
    ):
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind(address)
                return int(sock.getsockname()[1])
        except OSError as exc:
            error = exc
    raise error or OSError(f"no address to bind a free port on {host!r}")
