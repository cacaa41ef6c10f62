"""Isolation for the process-global events registry: handlers a test adds are removed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from aelastic.events import _dispatch


@pytest.fixture(autouse=True)
def _restore_destinations() -> Iterator[None]:
    registry = _dispatch.registry
    with registry.lock:
        before = {
            name: (dest.handlers, dest.primary, dest.capacity)
            for name, dest in registry.destinations.items()
        }
    yield
    _dispatch.flush_blocking(10)
    with registry.lock:
        for name, dest in list(registry.destinations.items()):
            if name not in before:  # forget it: the next use re-creates it from scratch
                for handler in dest.all_handlers():
                    dest.remove(handler.original)
                del registry.destinations[name]
                continue
            handlers, primary, capacity = before[name]
            for handler in dest.handlers:
                if handler not in handlers:
                    dest.remove(handler.original)
            if dest.primary is not primary:
                dest.set_primary(primary)
            dest.capacity = capacity


@pytest.fixture(autouse=True, scope="module")
def _stop_the_dispatcher() -> Iterator[None]:
    """Each module ends with the ``aelastic-events`` thread stopped: none leaks on."""
    yield
    assert _dispatch.shutdown_blocking(10)
    assert not [t for t in threading.enumerate() if t.name == "aelastic-events"]
