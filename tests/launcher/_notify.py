"""A TCP listener on 127.0.0.1 that job_worker.py reports to, line by line."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

JOB_WORKER = str(Path(__file__).parent / "job_worker.py")


class Workers:
    """The workers connected so far: their lines, and a way to answer them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conns: list[anyio.abc.SocketStream] = []
        send, self._lines = anyio.create_memory_object_stream[list[str]](1000)
        self._send = send

    def argv(self, *flags: str) -> tuple[str, ...]:
        """``(python, -u, job_worker.py, PORT, *flags)`` for a launch."""
        return (sys.executable, "-u", JOB_WORKER, str(self.port), *flags)

    async def line(self) -> list[str]:
        """The next line any worker sent, split into words."""
        return await self._lines.receive()

    async def ready(self, n: int) -> dict[int, int]:
        """Wait for ``n`` ``ready`` lines; return ``{local_rank: pid}``."""
        pids: dict[int, int] = {}
        while len(pids) < n:
            words = await self.line()
            if words[0] == "ready":
                pids[int(words[1])] = int(words[3])
        return pids

    async def tell_all(self, text: str) -> None:
        """Send ``text`` to every connected worker."""
        for conn in self.conns:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await conn.send(f"{text}\n".encode())

    async def _handle(self, conn: anyio.abc.SocketStream) -> None:
        self.conns.append(conn)
        stream = BufferedByteReceiveStream(conn)
        try:
            while True:
                line = await stream.receive_until(b"\n", 1024)
                await self._send.send(line.decode().split())
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            pass


@asynccontextmanager
async def workers_listener() -> AsyncIterator[Workers]:
    """Listen on 127.0.0.1 (free port) for job_worker.py connections while the block runs."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        workers = Workers(port)
        tg.start_soon(listener.serve, workers._handle)
        try:
            yield workers
        finally:
            for conn in workers.conns:
                await conn.aclose()
            tg.cancel_scope.cancel()
