"""The ``c10d`` (alias ``tcp``) backend: the dynamic rendezvous on an aelastic TCPStore.

The store at the endpoint is hosted by the agent whose address matches the endpoint
host (``is_host``; detected like torch: ``localhost``, a loopback address, this
machine's hostname, FQDN or one of its addresses) or by a standalone
``python -m aelastic store``. A would-be host that finds the port taken (another
agent on the same machine, or a standalone store) becomes a client.

**Surviving the store host.** Every completed round names an *heir*: its first member
(join order) that does not host the store, with its address (one field of the round's
``running`` tick; the coordinator reads at most one descriptor for it). When the store's
host is lost (its port refuses connections: the process and the store's data are gone;
or it is frozen: its kernel accepts connections but the store answered nothing for
``heartbeat_timeout`` and a fresh connection's request gets no answer within
``min(keep_alive_interval, 1 s)``, see :mod:`._hostwatch`; a store that cannot be
reached at all is retried instead, as after a partition), the heir hosts a fresh store
at its own address on the endpoint's port, the other survivors connect to it, and they
rendezvous there from round 0 (workers get it as their MASTER_ADDR, too). With
``min_nodes`` survivors the job goes on. New nodes must then use
``--rdzv-endpoint <heir address>:<port>`` (logged by every survivor, event
``store_moved``); with a DNS name or
virtual IP that follows the heir, the endpoint stays the same. If the heir is lost too,
or no round had completed, no node can know where the rendezvous continues: the
survivors fail with an error that says so. Survivors leaving a frozen host write its
successor into its store (its kernel buffers the write): resumed, the host finds it was
deposed at its next join and stops with :class:`RendezvousNonRetryableError` naming the
successor, instead of carrying on a second job in its own store.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._net import is_loopback, is_own_address
from ..store import Store, StoreError, StoreServer, TCPStoreClient
from ..store._exceptions import NotAStoreError
from ._coordinator import TICKS_KEPT
from ._dynamic import DynamicRendezvousHandler
from ._exceptions import (
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousEndpointError,
    RendezvousNonRetryableError,
)
from ._handler import RendezvousStoreInfo
from ._hostwatch import HostState, StoreWatch, host_lost
from ._params import DEFAULT_C10D_PORT, RendezvousParameters, parse_endpoint
from ._session import open_session
from ._settings import DynamicSettings
from ._state import Keys

__all__ = ("C10dRendezvousHandler", "create_c10d_handler", "is_local_address")

_log = logging.getLogger("aelastic.rendezvous")


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine (torch's ``_matches_machine_hostname``, plus
    the addresses of this machine's interfaces, and names that resolve to one).

    Blocking (it may ask the resolver): call it in a thread from async code.
    """
    known = _is_local_literal(host)
    if known is not None:
        return known
    hostname = socket.gethostname()
    if names_own_host(host, hostname, socket.getfqdn()):
        return True
    try:
        own = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(own & resolved) or any(is_own_address(str(a)) for a in resolved)


def names_own_host(host: str, hostname: str, fqdn: str) -> bool:
    """Whether ``host`` is this machine's ``hostname``, its ``fqdn``, or the fqdn cut
    after a label: a pod of a Kubernetes Indexed Job or JobSet is ``train-0`` with fqdn
    ``train-0.train.<ns>.svc.cluster.local``, and the endpoint ``train-0.train`` names
    it before the cluster's DNS has a record for it (which the resolver would need)."""
    host = host.rstrip(".").lower()
    fqdn = fqdn.rstrip(".").lower()
    return bool(host) and (host in (hostname.lower(), fqdn) or fqdn.startswith(host + "."))


def _is_local_literal(host: str) -> bool | None:
    """:func:`is_local_address` for ``localhost``, loopback and IP literals, which need no
    resolver (never blocks); None for any other name."""
    if host == "localhost" or is_loopback(host):
        return True
    if _is_ip(host.strip("[]")):
        return is_own_address(host)  # asked of the kernel: a bind, nothing sent
    return None


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
            rank_order=params.get("node_rank_order"),
        )

    async def _open_store(self, stack: AsyncExitStack, tg: TaskGroup) -> Store:
        host, port = self.host, self.port
        is_host = self._is_host
        if is_host is None:
            is_host = _is_local_literal(host)
        if is_host is None:  # a name: the resolver may block, so off the loop
            is_host = await anyio.to_thread.run_sync(is_local_address, host)
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
        # Connecting waits for a store not up yet, within the join's own bound too.
        timeout = self.settings.read_timeout
        connect = min(timeout, self.settings.join_timeout)
        bound = "read_timeout" if connect == timeout else "join_timeout"
        client = TCPStoreClient(host, port, timeout=timeout, connect_timeout=connect)

        async def waiting(waited: float) -> str:
            return (
                f"rendezvous {self._run_id!r} (c10d): this node has waited {waited:.0f} s for "
                f"the rendezvous store at {self._master_endpoint} to accept connections; it "
                f"waits up to {max(0.0, connect - waited):.0f} s more ({bound}={connect:g}). "
                "Start the node that hosts it (an agent on that host; --rdzv-conf is_host=1 "
                "makes an agent host it) or 'python -m aelastic "
                f"store --host {host} --port {port}'"
            )

        try:
            with self._reporter.waiting(waiting, tg):
                await stack.enter_async_context(client)
        except NotAStoreError as exc:
            raise RendezvousEndpointError(
                f"the rendezvous endpoint {self._master_endpoint} is not a store: {exc}; give "
                "--rdzv-endpoint the address of the host agent (or of 'python -m aelastic "
                "store')"
            ) from exc
        except (StoreError, OSError) as exc:
            raise RendezvousConnectionError(
                f"cannot reach the rendezvous store at {self._master_endpoint} within "
                f"{bound}={connect}s: {exc}; start the host agent first (the agent on "
                f"{host} hosts it, or the one given --rdzv-conf is_host=1), or a store with "
                f"'python -m aelastic store --host {host} --port {port}'"
            ) from exc
        await _open_wait_connection(client)
        return client

    # -- surviving the store host (see the module docstring) -----------------

    def _hosts_store(self) -> bool:
        return self.server is not None

    @property
    def hosts_store(self) -> bool:
        return self._hosts_store()

    def _endpoint(self, host: str) -> str:
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def _store_watch(self) -> StoreWatch | None:
        if self.server is not None:
            return None  # this node is the store: nothing to watch
        return StoreWatch(self.settings.heartbeat_timeout, self._probe_host)

    async def _probe_host(self) -> RendezvousConnectionError | None:
        """The store answered nothing for heartbeat_timeout: is its host lost?"""
        grace = min(self.settings.keep_alive_interval, 1.0)
        state = await _host_state(self.host, self.port, grace)
        if not host_lost(state):
            return None
        return RendezvousConnectionError(
            f"the rendezvous store at {self._master_endpoint} answered nothing for "
            f"heartbeat_timeout={self.settings.heartbeat_timeout}s and a new connection's "
            f"request got no answer within {grace}s ({state}): its host is frozen or hung"
        )

    async def _read_round(self) -> int:
        round_ = await super()._read_round()
        server = self.server
        if server is not None and await server.local_store.check([self._keys.deposed]):
            successor = (await server.local_store.get(self._keys.deposed)).decode()
            raise RendezvousNonRetryableError(
                f"this node hosts the rendezvous store at {self._master_endpoint}, but its "
                "peers declared it lost while it did not answer (frozen or hung) and moved "
                f"to its successor at {successor}; stopping here so the job does not split "
                f"in two. Restart this node with --rdzv-endpoint {successor} to rejoin"
            )
        return round_

    async def _recover_store(self, exc: RendezvousConnectionError, deadline: float) -> None:
        watch = self._host_watch
        state: HostState
        if watch is not None and watch.lost is not None:
            state = "silent"
        else:
            state = await _host_state(self.host, self.port, min(5.0, self.settings.read_timeout))
        if not host_lost(state):
            # Up but unreachable from here (a partition?), or already re-hosted at
            # the same address: keep trying the same endpoint.
            await self._retry_same_store(exc, deadline)
            return
        lost = self._master_endpoint
        heir, self._heir = self._heir, None
        if heir is None and state == "silent":
            await self._retry_same_store(exc, deadline)  # nowhere to go: it may come back
            return
        if heir is None:
            raise RendezvousConnectionError(
                f"the rendezvous store at {lost} is gone (its host stopped, and the store's "
                "data with it) and no round had completed here to name a successor, so this "
                "node cannot know where the rendezvous goes on; restart the job (a store "
                "that outlives the agents: 'python -m aelastic store')"
            ) from exc
        is_heir, addr = heir
        timeout = self.settings.read_timeout
        cm: AbstractAsyncContextManager[Any]
        if is_heir:
            bind = addr if _is_ip(addr) or addr == "localhost" else "::"
            cm = StoreServer(bind, self.port, allow_non_loopback=True)
        else:
            cm = TCPStoreClient(addr, self.port, timeout=timeout, connect_timeout=timeout)
        tg = self._tg
        assert tg is not None
        epoch = self._keys.epoch + 1
        marks = Keys(self._run_id, epoch).moved_marks()
        # The round this node ran in (which next_rendezvous left before it found the
        # store gone: self._view is None then) and the one it was joining, if any.
        for view in (self._member_view, self._view):
            if view is not None and view.tick is not None and view.keys is not None:
                marks |= view.keys.dissolved_ticks(view.round, view.tick.n, TICKS_KEPT)
        try:
            server, store, session = await tg.start(self._hold_store, cm, marks)
        except (StoreError, OSError) as error:
            role = "host it at" if is_heir else "reach its successor at"
            if state == "silent":
                # Not frozen but cut off behind something that accepts for it (a proxy)?
                # Then the successor is out of reach too: keep trying the same store.
                _log.warning(
                    "rendezvous store at %s does not answer and this node could not %s %s "
                    "(%s): trying the same store again",
                    lost,
                    role,
                    self._endpoint(addr),
                    error,
                )
                self._heir = heir
                await self._retry_same_store(exc, deadline)
                return
            raise RendezvousConnectionError(
                f"the rendezvous store at {lost} is gone (its host stopped) and this node "
                f"could not {role} {self._endpoint(addr)} within read_timeout={timeout}s "
                f"({error}): the store's host and its successor are both lost, so no node "
                "can carry the rendezvous on; restart the job"
            ) from exc
        self.server = server
        old_store, self._store = self._store, store
        self._session_actions.use(session)
        self.host = addr
        self._bootstrap = RendezvousStoreInfo(addr, self.port)
        self._master_endpoint = self._endpoint(addr)
        if state == "silent":
            await self._depose(old_store, self._master_endpoint)
        self._start_watch(tg)
        what = "hosts" if is_heir else "moved to"
        message = (
            f"rendezvous store at {lost} lost; this node {what} its successor at "
            f"{self._master_endpoint}: new nodes use --rdzv-endpoint {self._master_endpoint}"
        )
        _log.warning("%s", message)
        self._event("store_moved", message, state="FAILED")

    async def _retry_same_store(self, exc: RendezvousConnectionError, deadline: float) -> None:
        """Retry the same store until ``deadline`` (see the base class), with no watch
        meanwhile (its verdict would end every retry at once); a fresh one after."""
        if self._host_watch is not None:
            self._host_watch.stop()
            self._host_watch = None
        try:
            await super()._recover_store(exc, deadline)
        finally:
            assert self._tg is not None
            self._start_watch(self._tg)

    async def _depose(self, old: Store | None, successor: str) -> None:
        """Tell the frozen host, in its own store, where the job went (see the module
        docstring). Best effort and bounded: the request has no reply, the host's kernel
        buffers it until the host runs again."""
        if old is None:
            return
        with anyio.move_on_after(1.0), contextlib.suppress(StoreError, OSError):
            await old.set(self._keys.deposed, successor)

    async def _hold_store(
        self,
        cm: AbstractAsyncContextManager[Any],
        marks: dict[str, str],
        *,
        task_status: TaskStatus[tuple[StoreServer | None, Store, Any]],
    ) -> None:
        """Run a successor store (server or client) in the handler's task group until
        the handler is left (the task that opens a server must close it). A server
        holds ``marks`` before it listens (the earlier epochs' round keys, the lost
        round's ticks dissolved): a survivor whose client silently reconnects to it
        learns that the store was re-hosted at its next read, blocked or not."""
        if isinstance(cm, StoreServer):
            await cm.local_store.multi_set(list(marks), list(marks.values()))
        async with AsyncExitStack() as stack:
            resource = await stack.enter_async_context(cm)
            if isinstance(resource, StoreServer):
                server: StoreServer | None = resource
                store: Store = resource.local_store
            else:
                server, store = None, resource
                await _open_wait_connection(resource)
            session = await open_session(stack, store)
            task_status.started((server, store, session))
            await anyio.sleep_forever()


async def _host_state(host: str, port: int, bound: float) -> HostState:
    """Probe the store at ``host:port`` (see :data:`HostState`); takes at most 2 x ``bound``.

    A new connection must be accepted within ``bound`` seconds, then answer one request
    (after the protocol's handshake) within ``bound`` more.
    """
    accepted = False
    with anyio.move_on_after(bound):
        try:
            stream = await anyio.connect_tcp(host, port)
        except OSError as exc:
            # anyio raises "All connection attempts failed", caused by each attempt's error
            refused = isinstance(exc, ConnectionRefusedError) or isinstance(
                exc.__cause__, ConnectionRefusedError
            )
            return "refused" if refused else "unreachable"
        await stream.aclose()
        accepted = True
    if not accepted:
        return "unreachable"
    with anyio.move_on_after(bound):
        try:
            async with TCPStoreClient(host, port, timeout=bound, connect_timeout=bound) as probe:
                await probe.check(["rdzv/probe"])
            return "answers"
        except (StoreError, OSError):
            pass
    return "silent"


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
        raise RendezvousConfigError(
            f"rendezvous config store_type={store_type!r} is not supported; use store_type=tcp"
        )
    return C10dRendezvousHandler(params, DynamicSettings.from_params(params))
