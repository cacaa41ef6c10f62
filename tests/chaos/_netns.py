"""Two test hosts on one machine: network namespaces joined by a veth pair.

Host ``a`` is 10.231.<k>.1 and host ``b`` is 10.231.<k>.2, addresses that exist only
inside the two namespaces this module creates (nothing leaves the machine). A process runs
on a host through ``ip netns exec``; :meth:`Hosts.cut` takes b's end of the link down and
:meth:`Hosts.mend` brings it back, which is a network partition between the hosts.
Needs root and iproute2; :func:`unavailable` says why not when they are missing.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_counter = itertools.count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def unavailable() -> str | None:
    """Why two hosts cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's 'ip' is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        with two_hosts():
            pass
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        return f"cannot create network namespaces here: {exc} {detail.decode(errors='replace')}"
    return None


@dataclass(frozen=True)
class Hosts:
    namespaces: tuple[str, str]
    addresses: tuple[str, str]
    interfaces: tuple[str, str]

    def prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on ``host`` (0 is a, 1 is b)."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    def cut(self) -> None:
        _ip("-n", self.namespaces[1], "link", "set", self.interfaces[1], "down")

    def mend(self) -> None:
        _ip("-n", self.namespaces[1], "link", "set", self.interfaces[1], "up")


@contextmanager
def two_hosts() -> Iterator[Hosts]:
    """Create the two hosts; delete them (and the link) on exit, whatever happened."""
    k = next(_counter) % 250
    tag = f"ae{os.getpid() % 100000}x{k}"
    ns = (f"{tag}a", f"{tag}b")
    ifs = (f"{tag}va"[-15:], f"{tag}vb"[-15:])
    addrs = (f"10.231.{k}.1", f"10.231.{k}.2")
    made: list[str] = []
    try:
        for name in ns:
            _ip("netns", "add", name)
            made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1])
        for name, iface, addr in zip(ns, ifs, addrs, strict=True):
            _ip("link", "set", iface, "netns", name)
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", iface)
            _ip("-n", name, "link", "set", iface, "up")
        yield Hosts(ns, addrs, ifs)
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
