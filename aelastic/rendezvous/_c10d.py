"""The ``c10d`` (alias ``tcp``) backend: the dynamic rendezvous on an aelastic TCPStore.

The store at the endpoint is hosted by the agent whose address matches the endpoint
host (``is_host``; detected like torch: ``localhost``, a loopback address, this
machine's hostname, FQDN or one of its addresses) or by a standalone
``python -m aelastic store``. A would-be host that finds the port taken (another
agent on the same machine, or a standalone store) becomes a client.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from contextlib import AsyncExitStack

from anyio.abc import TaskGroup

from ..store import Store, StoreError, StoreServer, TCPStoreClient
from ._api import RendezvousStoreInfo
from ._dynamic import DynamicRendezvousHandler, DynamicSettings
from ._exceptions import RendezvousConnectionError, RendezvousError
from ._params import DEFAULT_C10D_PORT, RendezvousParameters, parse_endpoint

__all__ = ("C10dRendezvousHandler", "create_c10d_handler", "is_local_address")

_log = logging.getLogger("aelastic.rendezvous")


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine (torch's ``_matches_machine_hostname``)."""
    if host == "localhost":
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    hostname = socket.gethostname()
    if host in (hostname, socket.getfqdn()):
        return True
    try:
        own = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except OSError:
        return False
    return host in own


class C10dRendezvousHandler(DynamicRendezvousHandler):
    """Dynamic rendezvous whose store is a TCPStore at ``params.endpoint``.

    Entering the handler hosts the store (when this agent is the host) in the
    handler's task group, or connects to it, retrying for ``read_timeout`` seconds
    before raising :class:`RendezvousConnectionError` naming the endpoint.
    """

    def __init__(self, params: RendezvousParameters, settings: DynamicSettings) -> None:
        host, port = parse_endpoint(params.endpoint or "localhost", DEFAULT_C10D_PORT)
        self.host, self.port = host, port
        self._is_host = params.get_as_bool("is_host")
        self.server: StoreServer | None = None
        super().__init__(
            params.run_id,
            params.min_nodes,
            params.max_nodes,
            settings,
            backend="c10d",
            local_addr=params.local_addr,
            bootstrap_store_info=RendezvousStoreInfo(host, port),
            master_endpoint=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        )

    async def _open_store(self, stack: AsyncExitStack, tg: TaskGroup) -> Store:
        host, port = self.host, self.port
        is_host = self._is_host if self._is_host is not None else is_local_address(host)
        if is_host:
            bind = host if _is_ip(host) or host == "localhost" else "::"
            server = StoreServer(bind, port, allow_non_loopback=True)
            try:
                await stack.enter_async_context(server)
            except StoreError as exc:
                _log.info("not hosting the rendezvous store at %s:%s (%s)", host, port, exc)
            else:
                self.server = server
                _log.info("hosting the rendezvous store at %s", server.address)
                return server.local_store
        timeout = self.settings.read_timeout
        client = TCPStoreClient(host, port, timeout=timeout, connect_timeout=timeout)
        try:
            await stack.enter_async_context(client)
        except (StoreError, OSError) as exc:
            raise RendezvousConnectionError(
                f"cannot reach the rendezvous store at {self._master_endpoint} within "
                f"read_timeout={timeout}s: {exc}; start the host agent first, or a store with "
                f"'python -m aelastic store --host {host} --port {port}'"
            ) from exc
        await _open_wait_connection(client)
        return client


async def _open_wait_connection(client: TCPStoreClient) -> None:
    """Open the connection this node's blocking reads will use now, not mid-rendezvous.

    A TCPStoreClient sends each blocking WAIT on a pooled connection of its own; a
    member blocks on one key at a time, so one pooled connection is all it needs.
    """
    opener = getattr(client, "_open", None)
    idle = getattr(client, "_idle", None)
    if opener is None or not isinstance(idle, list) or idle:
        return
    # On failure the first blocking read connects (and reports) instead.
    with contextlib.suppress(StoreError, OSError):
        idle.append(await opener())


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def create_c10d_handler(params: RendezvousParameters) -> C10dRendezvousHandler:
    """Registry factory of the ``c10d``/``tcp`` backend."""
    store_type = str(params.get("store_type", "tcp")).lower()
    if store_type != "tcp":
        raise RendezvousError(
            f"rendezvous config store_type={store_type!r} is not supported; use store_type=tcp"
        )
    return C10dRendezvousHandler(params, DynamicSettings.from_params(params))
