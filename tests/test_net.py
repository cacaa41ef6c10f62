"""The loopback check that guards binding and picks the workers' store address."""

from __future__ import annotations

import pytest

from aelastic._net import is_loopback


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.3.2.1", "::1", "[::1]"])
def test_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "example.org", "", "127.0.0.x"])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_own_addresses_are_those_a_socket_binds() -> None:
    from aelastic._net import is_own_address

    assert is_own_address("127.0.0.1")
    assert is_own_address("127.0.0.2")  # Linux answers the whole 127/8 on lo
    assert not is_own_address("192.0.2.1")  # TEST-NET-1: no interface has it
    assert not is_own_address("0.0.0.0")  # binds, but names no interface
    assert not is_own_address("::")
    assert not is_own_address("localhost")  # names are not addresses
    assert not is_own_address("not an address")


def test_route_source_is_the_address_the_kernel_sends_from() -> None:
    from aelastic._net import route_source

    # to an address of lo, the kernel sends from that address (lo's route)
    assert route_source("127.0.0.1") == "127.0.0.1"
    # Linux sends to another 127/8 address from lo's first address
    assert route_source("127.0.0.2") in ("127.0.0.1", "127.0.0.2")
    assert route_source("a name") is None


def test_node_address_binds_the_route_source_and_announces_the_name_that_resolves_to_it() -> None:
    from aelastic._net import node_address

    # the name resolves to the address used: bind it, announce the name (torchrun's style)
    assert node_address("10.1.2.3", "node7", ["10.1.2.3", "fe80::1"]) == ("10.1.2.3", "node7")
    # the name resolves elsewhere (Debian's 127.0.1.1): announce the address
    assert node_address("10.1.2.3", "node7", ["127.0.1.1"]) == ("10.1.2.3", "10.1.2.3")
    assert node_address("10.1.2.3", "node7", []) == ("10.1.2.3", "10.1.2.3")
    # no route known: every interface, by name (torchrun's behaviour)
    assert node_address(None, "node7", []) == ("", "node7")
