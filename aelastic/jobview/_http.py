"""The job view over HTTP: ``GET /`` (the live page) and ``GET /view.json`` (its data).

Served by the health endpoint of every agent (:mod:`aelastic.health`) and by
``python -m aelastic dashboard``. Read-only. A read of the store is bounded (5 s);
a failure is a 503 whose JSON ``{"error": ...}`` the page shows as text.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ..health._http import Response
from ..store import StoreError
from ._exceptions import JobViewError
from ._page import PAGE, PAGE_HEADERS

__all__ = ("JOBVIEW_PATHS", "jobview_route", "view_route")

JOBVIEW_PATHS = ("/", "/index.html", "/view.json")
#: Longest wait for the store when answering ``/view.json``.
READ_TIMEOUT = 5.0

_PAGE = Response(200, "text/html; charset=utf-8", PAGE, PAGE_HEADERS)


async def _view_json(read: Callable[[], Awaitable[dict[str, Any]]]) -> Response:
    try:
        with anyio.fail_after(READ_TIMEOUT):
            body: dict[str, Any] = await read()
        status = 200
    except TimeoutError:
        body, status = {"error": f"the store did not answer within {READ_TIMEOUT:.0f} s"}, 503
    except (JobViewError, StoreError, OSError) as exc:
        body, status = {"error": str(exc)}, 503
    return Response(status, "application/json", json.dumps(body).encode())


def view_route(
    read: Callable[[], Awaitable[dict[str, Any]]], path: str
) -> Response | Awaitable[Response]:
    """Answer ``path`` of :data:`JOBVIEW_PATHS`; ``read()`` returns the job view."""
    if path == "/view.json":
        return _view_json(read)
    if path in ("/", "/index.html"):
        return _PAGE
    return Response(404, "text/plain; charset=utf-8", b"no page here: try / or /view.json\n")


def jobview_route(publisher: Any, path: str) -> Response | Awaitable[Response]:
    """:func:`view_route` for a job's health endpoint (``publisher``: the job's
    :class:`~aelastic.jobview._publish.StatusPublisher`, None when it publishes nothing)."""

    async def read() -> dict[str, Any]:
        if publisher is None:
            raise JobViewError("this job publishes no status (its rendezvous has no store)")
        view: dict[str, Any] = await publisher.read_view()
        return view

    return view_route(read, path)
