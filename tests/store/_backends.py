"""Run an async store test on every anyio backend: asyncio, asyncio + uvloop, trio.

The project runs pytest-asyncio in auto mode, which claims every async test and
fixture (and runs a fixture's setup and teardown in two tasks, which a
``StoreServer`` cannot allow). :func:`on_every_backend` turns an async test into a
plain test parametrized over the backends that runs it with :func:`anyio.run`;
the resources a test names as parameters are opened inside that run:

* ``store_server``: a :class:`StoreServer` on 127.0.0.1, free port;
* ``store_client``: a :class:`TCPStoreClient` to it (30 s timeout);
* ``store`` (with the ``store_kind`` parametrization): each kind of :class:`Store`.

Other parameters are ordinary pytest fixtures or parametrizations.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from aelastic.store import LocalStore, PrefixStore, Store, StoreServer, TCPStoreClient

BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
        ),
    ),
    pytest.param(("trio", {}), id="trio"),
]
STORE_KINDS = ["local", "tcp", "server-local", "prefix"]
_PROVIDED = ("store_server", "store_client", "store")


@contextlib.asynccontextmanager
async def open_store(kind: str) -> AsyncIterator[Store]:
    """A store of ``kind``: local, tcp (client to a server), server-local, prefix."""
    if kind == "local":
        async with LocalStore(timeout=10) as s:
            yield s
        return
    async with StoreServer() as server:
        if kind == "server-local":
            yield server.local_store
            return
        async with TCPStoreClient(server.host, server.port, timeout=10) as client:
            yield PrefixStore("pfx", client) if kind == "prefix" else client


def on_every_backend(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Make ``test`` a sync pytest test run by :func:`anyio.run` on every backend."""
    signature = inspect.signature(test)
    wanted = [n for n in signature.parameters if n in _PROVIDED]
    passed = [p for n, p in signature.parameters.items() if n not in _PROVIDED]

    def run(backend: tuple[str, dict[str, Any]], **fixtures: Any) -> None:
        kind = fixtures.pop("store_kind", None)

        async def main() -> None:
            async with contextlib.AsyncExitStack() as stack:
                kwargs = dict(fixtures)
                if "store_server" in wanted or "store_client" in wanted:
                    server = await stack.enter_async_context(StoreServer("127.0.0.1", 0))
                    kwargs.setdefault("store_server", server)
                    if "store_client" in wanted:
                        kwargs["store_client"] = await stack.enter_async_context(
                            TCPStoreClient(server.host, server.port, timeout=30.0)
                        )
                if "store" in wanted:
                    kwargs["store"] = await stack.enter_async_context(open_store(kind))
                await test(**{k: v for k, v in kwargs.items() if k in signature.parameters})

        name, options = backend
        anyio.run(main, backend=name, backend_options=options)

    params = [inspect.Parameter("backend", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if "store" in wanted:
        params.append(inspect.Parameter("store_kind", inspect.Parameter.KEYWORD_ONLY))
    params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in passed]
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__name__ = test.__name__
    run.__qualname__ = test.__qualname__
    run.__doc__ = test.__doc__
    run.__module__ = test.__module__
    marked = pytest.mark.parametrize("backend", BACKENDS)(run)
    if "store" in wanted:
        marked = pytest.mark.parametrize("store_kind", STORE_KINDS)(marked)
    return marked
