"""The tests' port helper (``tests/_ports.py``): outside the kernel's ephemeral range,
one disjoint slice per xdist worker, never twice in a process, and never a port in use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from _ports import _bindable, ephemeral_range, free_port, free_ports, own_slice, slice_index


def test_ports_lie_outside_the_ephemeral_range_and_are_never_repeated() -> None:
    ephemeral = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if p in ephemeral or p < 1024]


def test_the_ephemeral_range_is_the_kernels() -> None:
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert ephemeral_range() == range(low, high + 1)


def test_workers_and_a_serial_run_get_disjoint_slices() -> None:
    slices = [set(own_slice(w)) for w in (None, "gw0", "gw1", "gw2")]
    assert all(len(s) > 1000 for s in slices)
    for i, a in enumerate(slices):
        for b in slices[i + 1 :]:
            assert not a & b
    with pytest.raises(RuntimeError, match="gw<n>"):
        slice_index("master")


def test_a_block_is_consecutive_free_ports_and_a_port_in_use_is_refused() -> None:
    first = free_ports(3)
    held = []
    try:
        for port in range(first, first + 3):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))  # the helper said free: each must bind
            sock.listen()
            held.append(sock)
        assert not _bindable(first + 1, 1)  # the check refuses a port a listener holds
        assert free_port() not in range(first, first + 3)
    finally:
        for sock in held:
            sock.close()
