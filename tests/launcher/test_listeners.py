"""Every listening TCP socket of a real two-node job is one docs/security.md lists, and none
is bound to every interface (issue 37).

The sockets are read from Linux's ``/proc``: each process's socket inodes
(``/proc/<pid>/fd``) matched with the listening entries of ``/proc/net/tcp{,6}``.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from pathlib import Path

import pytest
from _procfs import socket_inodes

from ._nodes import WORKER, cluster, free_port, process_tree, records, wait_all

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
FAST = "keep_alive_interval=0.2,heartbeat_timeout=2,last_call_timeout=0.5,close_timeout=5"


def documented_listeners() -> dict[str, str]:
    """The listeners table of docs/security.md: listener name -> its default bind."""
    rows: dict[str, str] = {}
    for line in SECURITY.read_text().splitlines():
        match = re.match(r"\|\s*`([a-z-]+)`\s*\|([^|]*)\|([^|]*)\|", line)
        if match:
            rows[match.group(1)] = match.group(3).strip()
    return rows


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.IPv4Address(words) if len(raw) == 4 else ipaddress.IPv6Address(words)
    return str(ip), int(port, 16)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket of this namespace."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    found[int(fields[9])] = _address(fields[1])
    return found


async def test_every_listener_of_a_two_node_job_is_documented_and_bound_to_loopback(
    tmp_path: Path,
) -> None:
    table = documented_listeners()
    assert {"rendezvous-store", "worker-store", "checkpoint-peer", "health"} <= set(table)
    port = free_port()
    marker = tmp_path / "go"
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    argv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "listeners"]
    argv += ["--rdzv-conf", FAST, WORKER, str(out), "--when-file", str(marker)]
    found: list[tuple[str, str, int, bool]] = []  # (listener, address, port, is the agent)
    async with cluster() as c:
        nodes = [await c.start(argv) for _ in range(2)]
        for node in nodes:
            await node.wait_for_line(lambda line: line.startswith("READY"))
        master_port = {int(r["MASTER_PORT"]) for r in records(out)}
        assert len(master_port) == 1
        sockets = listening_sockets()
        for node in nodes:
            agent = node.process.pid
            for pid in process_tree(agent):
                for inode in socket_inodes(pid) & set(sockets):
                    address, bound = sockets[inode]
                    if bound == port:
                        name = "rendezvous-store"
                    elif bound in master_port:
                        name = "worker-store"
                    else:  # the one ephemeral listener of an agent in this job
                        name = "checkpoint-peer"
                    found.append((name, address, bound, pid == agent))
        marker.touch()
        codes = await wait_all(nodes, 90)
    assert codes == [0, 0], [n.err for n in nodes]
    names = [name for name, *_ in found]
    # the scan saw the two stores (ground truth: the endpoint and the workers' MASTER_PORT)
    assert names.count("rendezvous-store") == 1 and names.count("worker-store") == 1, found
    assert names.count("checkpoint-peer") <= 2, found  # at most one per agent
    for name, address, bound, is_agent in found:
        assert name in table, (name, address, bound)
        assert is_agent, f"{name} on {address}:{bound} is not the agent's own socket"
        assert address not in ("0.0.0.0", "::"), f"{name} listens on every interface"
        # a rendezvous on loopback: every server stays on the loopback address given
        assert address == "127.0.0.1", (name, address, bound)
