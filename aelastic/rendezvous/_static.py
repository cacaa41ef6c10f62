"""The ``static`` backend: a fixed world, node ranks given, no elasticity.

Node rank 0 hosts the store at the endpoint (``master_addr:master_port``); the other
nodes connect to it as clients. Workers share that store (``use_agent_store``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from ..store import PrefixStore, Store, StoreError, StoreServer, TCPStoreClient
from ._c10d import _is_ip
from ._exceptions import (
    RendezvousClosedError,
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousError,
)
from ._handler import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo
from ._ops import Ops
from ._params import RendezvousParameters, parse_endpoint
from ._static_join import announce, check_host, wait_for_nodes

__all__ = ("StaticRendezvousHandler", "create_static_handler")


class StaticRendezvousHandler(RendezvousHandler):
    """A fixed world of ``max_nodes`` nodes; this node's rank is config ``rank``.

    Entering the handler starts the store (rank 0) or connects to it (retrying for
    config ``timeout`` seconds, default 600) and announces this node there.
    :meth:`next_rendezvous` waits (up to ``timeout``) until every node has announced
    itself, saying which are missing (``_static_join``), then returns;
    :meth:`num_nodes_waiting` is always 0 and :meth:`wait_for_membership_change` never
    returns. :meth:`set_closed` marks the run closed for later :meth:`next_rendezvous`.
    """

    def __init__(self, params: RendezvousParameters) -> None:
        rank = params.get_as_int("rank")
        if rank is None:
            raise RendezvousConfigError(
                "the static rendezvous needs this node's rank: pass --node-rank "
                "(rendezvous config rank=<0..nnodes-1>)"
            )
        world = params.max_nodes
        if params.min_nodes != params.max_nodes:
            raise RendezvousConfigError(
                f"the static rendezvous needs a fixed world: min_nodes ({params.min_nodes}) "
                f"!= max_nodes ({params.max_nodes}); use --nnodes=N or the c10d backend"
            )
        if not 0 <= rank < world:
            raise RendezvousConfigError(
                f"node rank {rank} is out of range for {world} nodes (0..{world - 1})"
            )
        self.host, self.port = parse_endpoint(params.endpoint, None)
        self.rank = rank
        self.world_size = world
        self.timeout = params.get_positive_float("timeout", 600.0)
        self._run_id = params.run_id
        self._store: Store | None = None
        self.server: StoreServer | None = None

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return True

    @property
    def hosts_store(self) -> bool:
        return self.server is not None

    @property
    def _closed_key(self) -> str:
        return f"rdzv/{self._run_id}/static/closed"

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[StaticRendezvousHandler]:
        """Host the store (rank 0) or connect to it, announce this node, and hold the
        store for the block (see the class docstring); nothing to leave at the end."""
        async with AsyncExitStack() as stack:
            endpoint = f"{self.host}:{self.port}"
            if self.rank == 0:
                bind = self.host if _is_ip(self.host) or self.host == "localhost" else "::"
                server = StoreServer(bind, self.port, allow_non_loopback=True)
                try:
                    await stack.enter_async_context(server)
                except StoreError as exc:
                    raise RendezvousConnectionError(
                        f"node rank 0 cannot host the static rendezvous store at {endpoint}: {exc}"
                    ) from exc
                self.server = server
                store: Store = server.local_store
            else:
                await check_host(
                    self.host,
                    self.port,
                    run_id=self._run_id,
                    rank=self.rank,
                    world_size=self.world_size,
                    within=self.timeout,
                )
                client = TCPStoreClient(
                    self.host, self.port, timeout=self.timeout, connect_timeout=self.timeout
                )
                try:
                    await stack.enter_async_context(client)
                except (StoreError, OSError) as exc:
                    raise RendezvousConnectionError(
                        f"cannot reach the static rendezvous store at {endpoint} (hosted by "
                        f"node rank 0) within timeout={self.timeout}s: {exc}"
                    ) from exc
                store = client
            await announce(Ops(store, self.timeout), self._run_id, self.rank)
            self._store = store
            try:
                yield self
            finally:
                self._store = None

    @property
    def started(self) -> bool:
        return self._store is not None

    async def _ops(self) -> Ops:
        await self._autostart()
        if self._store is None:
            raise RendezvousError(
                "the static rendezvous handler is not started: use 'async with handler:', "
                "or give it a task group with handler.run_in(tg)"
            )
        return Ops(self._store, self.timeout)

    async def next_rendezvous(self) -> RendezvousInfo:
        ops = await self._ops()
        if await ops.check(self._closed_key):
            raise RendezvousClosedError.for_run(self._run_id)
        await wait_for_nodes(
            ops,
            run_id=self._run_id,
            rank=self.rank,
            world_size=self.world_size,
            endpoint=f"{self.host}:{self.server.port if self.server else self.port}",
            within=self.timeout,
        )
        assert self._store is not None
        return RendezvousInfo(
            store=PrefixStore(f"rdzv/{self._run_id}/0", self._store),
            rank=self.rank,
            world_size=self.world_size,
            bootstrap_store_info=RendezvousStoreInfo(self.host, self.port),
            round=0,
        )

    async def is_closed(self) -> bool:
        return await (await self._ops()).check(self._closed_key)

    async def set_closed(self) -> None:
        ops = await self._ops()
        await ops.set(self._closed_key, "1")
        await ops.check(self._closed_key)  # SET has no reply: wait until it is applied

    async def num_nodes_waiting(self) -> int:
        return 0

    async def shutdown(self) -> bool:
        """Nothing to leave in a fixed world; a handler started by run_in() stops."""
        self._serve_ends()
        return True


def create_static_handler(params: RendezvousParameters) -> StaticRendezvousHandler:
    """Registry factory of the ``static`` backend."""
    return StaticRendezvousHandler(params)
