"""Fixtures for worker-process tests: a unix socket workers report to, and /proc helpers."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator

import anyio
import anyio.abc
import pytest

#: Python source a worker runs first to get ``report(msg)``: one line to the test.
REPORT_PRELUDE = """
import os, socket
def report(msg):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AELASTIC_TEST_REPORT"])
    s.sendall((str(msg) + "\\n").encode())
    s.close()
"""


class Reporter:
    """Receives one-line messages from workers (``report(msg)`` in the child)."""

    def __init__(self, path: str, listener: anyio.abc.SocketListener) -> None:
        self.path = path
        self._listener = listener

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["AELASTIC_TEST_REPORT"] = self.path
        env.update(extra)
        return env

    async def receive(self, limit: float = 20.0) -> str:
        with anyio.fail_after(limit):
            conn = await self._listener.accept()
            async with conn:
                data = b""
                while not data.endswith(b"\n"):
                    try:
                        data += await conn.receive()
                    except anyio.EndOfStream:
                        break
        return data.decode().strip()


@pytest.fixture
def short_tmp() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="aew", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def reporter(short_tmp: str) -> AsyncIterator[Reporter]:
    path = os.path.join(short_tmp, "r.sock")
    listener = await anyio.create_unix_listener(path)
    async with listener:
        yield Reporter(path, listener)


def py(code: str) -> list[str]:
    """argv running ``code`` after the report prelude."""
    return [sys.executable, "-c", REPORT_PRELUDE + code]


def pid_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            stat = fp.read()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def wait_gone(pid: int, limit: float = 10.0) -> None:
    """Bounded wait until ``pid`` is gone (polls /proc: real state of a process that is
    not our child, so there is nothing to wait on; test-only)."""
    with anyio.fail_after(limit):
        while not pid_gone(pid):  # noqa: ASYNC110
            await anyio.sleep(0.02)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))
