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
