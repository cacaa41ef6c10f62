"""TCP ports for the tests' servers, safe with several test processes at once.

Binding port 0 and closing the socket (``aelastic._net.free_port``) hands out a port
from the kernel's ephemeral range, the very range the kernel draws from for every
outgoing connection and every other ``bind(0)``: between the check and the server's
own bind, another test process (an xdist worker, an engineer's run beside it) or a
connection's local end can take it. Here a port comes from outside that range
(``/proc/sys/net/ipv4/ip_local_port_range``), from a slice of the port space of this
process's own (one per xdist worker, ``PYTEST_XDIST_WORKER``; serial runs have one of
their own too), is never handed out twice in one process, and is still checked with a
bind on every interface before it is handed out.

Errors: :class:`RuntimeError` when the slice has no free port left (it holds well over a
thousand; the suite uses a few hundred per process).
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

#: the lowest port handed out: below it lie the well-known and many services' ports
LOW = 10000
#: ports that tools and examples use as their default (torchrun's c10d 29400, the
#: MASTER_PORT 29500, etcd's 2379/2380 lie below LOW anyway): a test that uses one
#: of them on purpose must not find it taken by another test's server
AVOID = frozenset({29400, 29500})
#: slices of the pool: slice 0 for a run without xdist, slice n + 1 for worker gw<n>
SLICES = 16

_lock = threading.Lock()
_handed: set[int] = set()
_cursor: Iterator[int] | None = None


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The kernel's ephemeral port range (Linux's default 32768-60999 if unreadable)."""
    try:
        low, high = (int(n) for n in path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def pool() -> list[int]:
    """Every port this module may hand out, in order: LOW..65535 less the ephemeral range."""
    ephemeral = ephemeral_range()
    return [p for p in range(LOW, 65536) if p not in ephemeral and p not in AVOID]


def slice_index(worker: str | None) -> int:
    """The slice of ``worker`` (``PYTEST_XDIST_WORKER``, ``gw<n>``); 0 when not under xdist."""
    if not worker:
        return 0
    found = re.fullmatch(r"gw(\d+)", worker)
    if found is None:
        raise RuntimeError(f"PYTEST_XDIST_WORKER={worker!r}: expected gw<n>")
    return 1 + int(found.group(1)) % (SLICES - 1)


def own_slice(worker: str | None) -> list[int]:
    """The ports reserved for ``worker``: one of :data:`SLICES` equal, disjoint parts."""
    ports = pool()
    size = len(ports) // SLICES
    start = slice_index(worker) * size
    return ports[start : start + size]


def _bindable(first: int, count: int) -> bool:
    """Whether ``first`` .. ``first + count - 1`` can all be bound on every interface now."""
    held: list[socket.socket] = []
    try:
        for port in range(first, first + count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        for sock in held:
            sock.close()


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports, free now and never handed out before here.

    The walk through this process's slice starts at a random place (two serial runs
    at once seldom meet) and wraps once.

    Raises:
        RuntimeError: the slice has no ``count`` consecutive free ports left.
    """
    global _cursor
    with _lock:
        ports = own_slice(os.environ.get("PYTEST_XDIST_WORKER"))
        reserved = set(ports)
        if _cursor is None:
            start = secrets.randbelow(len(ports))
            _cursor = itertools.cycle(ports[start:] + ports[:start])
        for first in itertools.islice(_cursor, len(ports)):
            block = range(first, first + count)
            if any(p not in reserved or p in _handed for p in block):
                continue
            if _bindable(first, count):
                _handed.update(block)
                return first
    raise RuntimeError(
        f"no {count} consecutive free ports left in this test process's slice "
        f"({ports[0]}..{ports[-1]}, {len(_handed)} handed out)"
    )


def free_port() -> int:
    """One port free on every interface now, never handed out before in this process."""
    return free_ports(1)
