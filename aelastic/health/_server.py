"""``serve_health``: the job's health endpoint, on an anyio TCP listener (any backend).

Routes: ``GET /healthz`` (200 once this event loop answers: the agent's loop is alive),
``/readyz`` (200 while the workers run, else 503), ``/status`` (JSON) and ``/metrics``
(Prometheus text). Each connection carries one request and is closed; a connection
that does not complete its request within 5 s is dropped.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from anyio.abc import SocketAttribute, SocketStream

from ._http import Response, serve_one
from ._report import is_ready, metrics_text, status

if TYPE_CHECKING:
    from ..launcher import Job

__all__ = ("serve_health",)

#: How long one connection may take to send its request and get the answer.
_CONNECTION_TIMEOUT = 5.0
_TEXT = "text/plain; charset=utf-8"


def _route(job: Job, method: str, path: str) -> Response:
    if path == "/healthz":
        return Response(200, _TEXT, b"ok\n")
    if path == "/readyz":
        if is_ready(job):
            return Response(200, _TEXT, b"ready\n")
        return Response(503, _TEXT, f"not ready: {job.state.value}\n".encode())
    if path == "/status":
        body = json.dumps(status(job), indent=1).encode() + b"\n"
        return Response(200, "application/json", body)
    if path == "/metrics":
        return Response(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(job).encode())
    return Response(404, _TEXT, f"no page {path}: try /healthz /readyz /status /metrics\n".encode())


async def serve_health(
    job: Job,
    host: str,
    port: int,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``job``'s health endpoint on ``host:port`` until cancelled.

    ``address = await task_group.start(serve_health, job, "127.0.0.1", 0)`` returns
    the bound ``(host, port)`` once it listens. Cancellation closes the listener and
    every open connection at once.

    Raises:
        OSError: ``host:port`` cannot be bound (in use, not a local address).
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    async with listener:
        bound = listener.extra(SocketAttribute.local_address)
        task_status.started((str(bound[0]), int(bound[1])))

        async def handle(stream: SocketStream) -> None:
            async with stream:
                with anyio.move_on_after(_CONNECTION_TIMEOUT):
                    await serve_one(stream, lambda method, path: _route(job, method, path))

        await listener.serve(handle)
