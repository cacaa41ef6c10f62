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
