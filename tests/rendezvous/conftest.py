"""Backend-neutral rendezvous tests run on asyncio, uvloop and trio (anyio's pytest plugin).

A module opts in with ``pytestmark = pytest.mark.anyio``; the others stay on
pytest-asyncio (``asyncio_mode = auto``).
"""

from __future__ import annotations

from typing import Any

import pytest

BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture
def rdzv_event_names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the rendezvous events recorded during the test, in order.

    The handlers record through ``aelastic.rendezvous._events``; replacing the recorder
    there sees every transition without registering a handler on the process-wide
    event bus that other tests share.
    """
    from aelastic.rendezvous import _events

    names: list[str] = []
    monkeypatch.setattr(
        _events, "construct_and_record_rdzv_event", lambda **kw: names.append(str(kw["name"]))
    )
    return names
