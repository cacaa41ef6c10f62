"""``serve_health``: the job's health endpoint, on an anyio TCP listener (any backend).

Routes: ``GET /healthz`` (200 once this event loop answers: the agent's loop is alive),
``/readyz`` (200 while the workers run, else 503), ``/status`` (JSON), ``/metrics``
(Prometheus text), and the whole job's live page ``/`` with its JSON ``/view.json``
(:mod:`aelastic.jobview`). Each connection carries one request and is closed; a connection
that does not complete its request within 5 s is dropped, and at most 32 are served
at a time (more are closed at once: a probe storm cannot pile up tasks on the agent's
loop). A host name that resolves to several addresses (``localhost`` as 127.0.0.1 and
::1) is served on every one of them, on one port.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
from anyio.abc import Listener, SocketAttribute, SocketStream
from anyio.streams.stapled import MultiListener

from ._exceptions import HealthPortError
from ._http import Response, Route, serve_one
from ._report import is_ready, metrics_text, status
from ._view import JobView

__all__ = ("ExtraRoute", "serve_health", "serve_routes")

#: How long one connection may take to send its request and get the answer.
_CONNECTION_TIMEOUT = 5.0
#: Connections served at once; more are closed as soon as they are accepted.
_MAX_CONNECTIONS = 32
#: Tries at finding a free port common to every address of the host (port 0).
_PORT_TRIES = 5
_TEXT = "text/plain; charset=utf-8"


#: A route for more pages: the answer for ``(method, path)``, or None when the path is
#: not one of its own (the launcher serves :mod:`aelastic.jobview`'s page this way).
ExtraRoute = Callable[[str, str], "Response | Awaitable[Response] | None"]


def _route(
    job: JobView, extra: ExtraRoute | None, method: str, path: str
) -> Response | Awaitable[Response]:
    if extra is not None:
        answer = extra(method, path)
        if answer is not None:
            return answer
    if path == "/healthz":
        return Response(200, _TEXT, b"ok\n")
    if path == "/readyz":
        if is_ready(job):
            return Response(200, _TEXT, b"ready\n")
        why = job.unhealthy_reason()
        state = f"unhealthy node: {why}" if why else job.state.value
        return Response(503, _TEXT, f"not ready: {state}\n".encode())
    if path == "/status":
        body = json.dumps(status(job), indent=1).encode() + b"\n"
        return Response(200, "application/json", body)
    if path == "/metrics":
        return Response(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(job).encode())
    routes = "/ /healthz /readyz /status /metrics"
    return Response(404, _TEXT, f"no page {path}: try {routes}\n".encode())


async def _addresses(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for listening, in resolver order, each once."""
    infos = await anyio.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_ADDRCONFIG
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _bind_all(addresses: list[str], port: int) -> MultiListener[SocketStream]:
    """Listen on every address on ONE port: the first address's (a free one for 0).

    With port 0 each address would otherwise get a different free port, and only
    one could be reported. When the first address's free port is taken on another
    address, all are closed and another port is tried (a few times).
    """
    for attempt in range(_PORT_TRIES):
        listeners: list[Listener[SocketStream]] = []
        chosen = port
        try:
            for address in addresses:
                bound = await anyio.create_tcp_listener(local_host=address, local_port=chosen)
                listeners.extend(bound.listeners)
                chosen = int(bound.extra(SocketAttribute.local_port))
        except OSError:
            for listener in listeners:
                await anyio.aclose_forcefully(listener)
            if port != 0 or len(listeners) == 0 or attempt == _PORT_TRIES - 1:
                raise
            continue
        except BaseException:
            for listener in listeners:
                await anyio.aclose_forcefully(listener)
            raise
        return MultiListener(listeners)
    raise AssertionError("unreachable")  # pragma: no cover


async def serve_health(
    job: JobView,
    host: str,
    port: int,
    *,
    extra_route: ExtraRoute | None = None,
    max_connections: int = _MAX_CONNECTIONS,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``job``'s health endpoint on ``host:port`` until cancelled.

    ``address = await task_group.start(serve_health, job, "127.0.0.1", 0)`` returns
    the bound ``(host, port)`` once it listens: every address ``host`` resolves to
    listens on that one port. At most ``max_connections`` connections are served at
    once; more are closed as soon as they are accepted. Cancellation closes the
    listeners and every open connection at once. ``extra_route`` answers the paths it
    knows before the health routes (the launcher adds the job view's ``/`` this way).

    Raises:
        HealthPortError: ``host:port`` cannot be bound (in use, not a local address);
            also an ``OSError`` with the original ``errno``.
    """
    await serve_routes(
        lambda method, path: _route(job, extra_route, method, path),
        host,
        port,
        max_connections=max_connections,
        task_status=task_status,
    )


async def serve_routes(
    route: Route,
    host: str,
    port: int,
    *,
    max_connections: int = _MAX_CONNECTIONS,
    connection_timeout: float = _CONNECTION_TIMEOUT,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``route`` over HTTP on ``host:port`` until cancelled (as :func:`serve_health`).

    A connection that has not sent its request and received the answer within
    ``connection_timeout`` seconds is closed.

    Raises:
        HealthPortError: ``host:port`` cannot be bound (in use, not a local address);
            also an ``OSError`` with the original ``errno``.
    """
    try:
        listener = await _bind_all(await _addresses(host, port), port)
    except OSError as exc:
        raise HealthPortError(
            exc.errno,
            f"health endpoint: cannot listen on {host}:{port}: {exc.strerror or exc}; choose "
            "another port (--health-port, HealthSettings.port), or 0 for any free port",
        ) from None
    limiter = anyio.CapacityLimiter(max_connections)
    async with listener:
        bound = listener.listeners[0].extra(SocketAttribute.local_address)
        task_status.started((str(bound[0]), int(bound[1])))

        async def handle(stream: SocketStream) -> None:
            async with stream:
                try:
                    limiter.acquire_nowait()
                except anyio.WouldBlock:
                    return  # over the limit: closed at once
                try:
                    with anyio.move_on_after(connection_timeout):
                        await serve_one(stream, route)
                finally:
                    limiter.release()

        await listener.serve(handle)
