"""Address and connection helpers shared by the store, the agent, the rendezvous backends
and the checkpoint peer copies."""

from __future__ import annotations

import functools
import os
import socket
from typing import Any

__all__ = (
    "KEEPALIVE_COUNT",
    "KEEPALIVE_IDLE",
    "KEEPALIVE_INTERVAL",
    "USER_TIMEOUT_MS",
    "connect_socket",
    "free_port",
    "is_loopback",
    "is_own_address",
    "node_address",
    "node_name",
    "route_source",
    "set_keepalive",
)


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


def is_own_address(host: str) -> bool:
    """Whether the IP literal ``host`` is an address of one of this machine's interfaces.

    Asked of the kernel, not of the resolver: a UDP socket can be bound to it
    (``EADDRNOTAVAIL`` otherwise). Names, the unspecified addresses (``0.0.0.0``,
    ``::``) and malformed input are not. Never blocks (binding sends nothing).
    """
    import ipaddress

    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if ip.is_unspecified:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(ip), 0))
    except OSError:
        return False
    return True


def route_source(address: str) -> str | None:
    """The local address this machine sends from to reach the IP literal ``address``.

    The kernel's route: ``connect()`` on a UDP socket sends nothing and fixes the
    source address, which ``getsockname()`` names. None when there is no route (or
    ``address`` is not an IP literal). Never blocks.
    """
    import ipaddress

    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((str(ip), 9))  # the port does not matter: nothing is sent
            return str(sock.getsockname()[0])
    except OSError:
        return None


def node_address(source: str | None, name: str, name_addresses: list[str]) -> tuple[str, str]:
    """(address to bind, address to announce) of a server the other nodes must reach.

    ``source``: the address this node reaches the rendezvous from (:func:`route_source`),
    None if unknown; ``name``: the host name; ``name_addresses``: what ``name``
    resolves to. Binds ``source`` and announces the host name when it resolves to that
    very address (as torchrun's MASTER_ADDR, a host name), else the address itself. With
    no ``source``, every interface and the host name (torchrun's behaviour).
    """
    if source is None:
        return "", name
    return source, name if source in name_addresses else source


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


#: TCP keepalive of client connections: first probe after this many idle seconds, then
#: every interval, dropped after that many unanswered probes (a powered-off or cut-off
#: peer fails the connection in ~10 s instead of the kernel's 2 hours).
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 5, 1, 5
#: ``TCP_USER_TIMEOUT``: a connection whose sent data stays unacknowledged this long
#: (milliseconds) fails, instead of retransmitting for ~15 minutes.
USER_TIMEOUT_MS = 20_000


def set_keepalive(sock: socket.socket) -> None:
    """Turn on TCP keepalive and ``TCP_USER_TIMEOUT`` (where the platform has them)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


async def connect_socket(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (``TCP_NODELAY``, keepalive: see
    :func:`set_keepalive`); raises :class:`OSError`.

    IP literals are used as they are (no resolver thread); names go through
    :func:`anyio.getaddrinfo`. Cancelled, it closes the socket it was opening.
    """
    import ipaddress  # off the launch path: this module is imported before anyio is

    import anyio

    infos: list[tuple[Any, ...]]
    try:
        ipaddress.ip_address(host)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except ValueError:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, type_, proto, _, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_keepalive(sock)
            try:
                sock.connect(addr)
            except BlockingIOError:
                await anyio.wait_writable(sock)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"connect to {host}:{port}: {os.strerror(err)}") from None
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise last if last is not None else OSError(f"no address for {host}:{port}")
