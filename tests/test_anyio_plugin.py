"""Tests marked ``anyio`` really run on the backend they are parametrized with.

Without the hand-back in ``tests/conftest.py``, pytest-asyncio's auto mode would run
all three on plain asyncio and they would pass without ever touching uvloop or trio.
"""

from __future__ import annotations

import pytest
import sniffio

pytestmark = pytest.mark.anyio


async def test_runs_on_the_backend_it_names(anyio_backend: object) -> None:
    name, options = anyio_backend if isinstance(anyio_backend, tuple) else (anyio_backend, {})
    assert sniffio.current_async_library() == name
    if name == "asyncio":
        import asyncio

        loop_module = type(asyncio.get_running_loop()).__module__
        assert loop_module.startswith("uvloop") is bool(options.get("use_uvloop"))


async def test_async_fixtures_run_there_too(anyio_backend: object, backend_of_fixture: str) -> None:
    assert backend_of_fixture == sniffio.current_async_library()


@pytest.fixture
async def backend_of_fixture() -> str:
    return sniffio.current_async_library()
