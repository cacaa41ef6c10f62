"""One HTTP/1.1 exchange on a byte stream, parsed by h11 (a sans-IO HTTP library).

The server side of a probe: read one request, answer it, close. Bounded: a request
whose head, or whose body, is larger than 16 KiB is refused (413), and the caller bounds
the time (a stalled client must not hold a task forever). h11 is imported here only, so
``import aelastic`` never loads it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import anyio
import h11
from anyio.abc import ByteStream

from .._dataclass import dataclass

__all__ = ("Response", "Route", "serve_one")

_MAX_REQUEST = 16 * 1024
_CHUNK = 4096


@dataclass(frozen=True)
class Response:
    """What a route answers: status code, content type and body."""

    status: int
    content_type: str
    body: bytes
    #: further headers, e.g. a page's Content-Security-Policy
    headers: tuple[tuple[str, str], ...] = ()


def _text(status: int, message: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", f"{message}\n".encode())


#: A route: ``(method, path) -> Response``, or an awaitable of one (a page read from a store).
Route = Callable[[str, str], "Response | Awaitable[Response]"]


async def serve_one(stream: ByteStream, route: Route) -> None:
    """Answer one request on ``stream`` with ``route(method, path)`` and close it.

    A malformed or oversized request gets 400/413 (when the connection still allows a
    response). A client that disconnects early is not an error. Does not close
    ``stream`` itself; cancellation is the caller's bound.
    """
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST)
    try:
        request = await _read_request(conn, stream)
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await _send(
                    conn, stream, _text(exc.error_status_hint, f"bad request: {exc}"), False
                )
                await _linger(stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        return
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return
    if request is None:
        return
    method = request.method.decode("ascii", "replace").upper()
    path = request.target.decode("ascii", "replace").split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        response = _text(405, f"method {method} not allowed: use GET")
    else:
        answer = route(method, path)
        response = await answer if inspect.isawaitable(answer) else answer
    try:
        await _send(conn, stream, response, method == "HEAD")
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, h11.LocalProtocolError):
        return


async def _linger(stream: ByteStream) -> None:
    """After an error answer, read and drop what the client still sends (at most 1 MiB,
    1 s) so that closing does not reset the connection before it reads the answer."""
    await stream.send_eof()
    dropped = 0
    with anyio.move_on_after(1.0):
        while dropped < 2**20:
            try:
                dropped += len(await stream.receive(65536))
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return


async def _read_request(conn: h11.Connection, stream: ByteStream) -> h11.Request | None:
    request: h11.Request | None = None
    body = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_CHUNK)
            except anyio.EndOfStream:
                data = b""
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.EndOfMessage):
            return request
        elif isinstance(event, h11.ConnectionClosed):
            return None
        elif isinstance(event, h11.Data):  # a request body: ignored (probes send none)
            body += len(event.data)
            if body > _MAX_REQUEST:
                raise h11.RemoteProtocolError(
                    f"request body larger than {_MAX_REQUEST} bytes", error_status_hint=413
                )


async def _send(conn: h11.Connection, stream: ByteStream, response: Response, head: bool) -> None:
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        ("connection", "close"),
        ("cache-control", "no-store"),
        *response.headers,
    ]
    out = conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
    if not head:
        out += conn.send(h11.Data(data=response.body)) or b""
    out += conn.send(h11.EndOfMessage()) or b""
    await stream.send(out)
