"""A small async etcd v3 client: gRPC (``grpc.aio``) over aetcd's generated stubs.

aetcd's own ``Client`` has no TLS, no endpoint failover and spawns its own
watcher tasks; this module uses only its protobuf/gRPC stubs and adds what the
rendezvous needs: several endpoints with failover, TLS and user/password auth,
per-call deadlines, watches that reconnect and resume from the last revision
they delivered, and a lease keep-alive loop.

Runs on the asyncio backend of anyio (``grpc.aio`` is asyncio-based).

Every network error surfaces as :class:`~aelastic.store.StoreConnectionError`
(etcd unreachable for the whole call deadline) or
:class:`~aelastic.store.StoreError` (etcd refused the request), naming the
endpoint; cancellation cancels the RPC in flight.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import sniffio
from anyio.abc import AsyncResource

from ..._dataclass import dataclass
from ...store import StoreConnectionError, StoreError
from .._exceptions import RendezvousConfigError, RendezvousUnsupportedLoopError
from ._exceptions import EtcdCompactedError, EtcdRequestError

try:
    import grpc
    import grpc.aio
    from aetcd import rpc
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the etcd rendezvous backend needs the 'etcd' extra: pip install 'aelastic[etcd]'"
    ) from exc

__all__ = (
    "DEFAULT_ETCD_PORT",
    "EtcdClient",
    "EtcdConfig",
    "EtcdWatch",
    "parse_endpoints",
    "prefix_end",
    "require_asyncio",
)

#: What grpc.aio raises when a request is written to a stream the server already ended
#: (etcd restarted or failed over between two keep-alives): "RPC already finished".
#: A lost stream like any other, so it is retried, never surfaced.
_StreamFinished = asyncio.InvalidStateError

log = logging.getLogger(__name__)

#: etcd's client port, used when an endpoint has none.
DEFAULT_ETCD_PORT = 2379

_T = TypeVar("_T")

#: Bound on closing the gRPC channels (a shielded cleanup must end).
_CLOSE_TIMEOUT = 5.0


def require_asyncio() -> None:
    """Raise RendezvousUnsupportedLoopError unless running on anyio's asyncio backend.

    ``grpc.aio`` needs an asyncio event loop; on trio it would fail deep inside gRPC
    with "no running event loop". Call before any I/O.
    """
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return  # not in async code: the first await tells
    if library != "asyncio":
        raise RendezvousUnsupportedLoopError(
            f"the etcd rendezvous backend runs only on asyncio (its gRPC client, grpc.aio, "
            f"is asyncio-based), not on {library}; run the agent on asyncio or uvloop "
            "(anyio.run(..., backend='asyncio')) or use --rdzv-backend c10d, which runs "
            "on every anyio backend"
        )


# Codes after which the same request may be retried on the next endpoint: the
# server did not process it (connection refused/reset, no leader yet).
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})

_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # Reconnect quickly after an etcd restart (grpc's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Notice a dead server under an idle watch.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def prefix_end(prefix: bytes) -> bytes:
    """Return the ``range_end`` that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def parse_endpoints(endpoint: str, default_port: int = DEFAULT_ETCD_PORT) -> list[tuple[str, int]]:
    """Parse ``"host1:2379,host2:2379"`` (scheme prefixes and ``[v6]`` allowed).

    Raises:
        RendezvousConfigError: an entry is empty or its port is not a number in 1..65535.
    """
    result: list[tuple[str, int]] = []
    for raw in endpoint.split(","):
        item = raw.strip()
        for scheme in ("http://", "https://"):
            if item.startswith(scheme):
                item = item[len(scheme) :]
        item = item.rstrip("/")
        if not item:
            raise RendezvousConfigError(
                f"empty etcd endpoint in {endpoint!r}; expected 'host:port[,host:port...]'"
            )
        host, port_text = item, ""
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            host, port_text = item.split(":")
        port = default_port
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise RendezvousConfigError(
                    f"bad port {port_text!r} in etcd endpoint {raw.strip()!r}; "
                    "expected 'host:port' with a port in 1..65535"
                )
            port = int(port_text)
        result.append((host, port))
    return result


@dataclass(frozen=True)
class EtcdConfig:
    """How to reach etcd: endpoints, TLS, credentials and the per-request deadline."""

    endpoints: tuple[tuple[str, int], ...]
    protocol: str = "http"
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = None
    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise RendezvousConfigError("no etcd endpoint given; pass 'host:port[,host:port...]'")
        if self.protocol not in ("http", "https"):
            raise RendezvousConfigError(
                f"etcd protocol must be 'http' or 'https', not {self.protocol!r}"
            )
        if (self.username is None) != (self.password is None):
            raise RendezvousConfigError("etcd authentication needs both 'username' and 'password'")
        if (self.cert is None) != (self.key is None):
            raise RendezvousConfigError("etcd client TLS needs both 'cert' and 'key'")
        if not self.read_timeout > 0:
            raise RendezvousConfigError(f"etcd read_timeout must be > 0, not {self.read_timeout!r}")
        for name in ("cacert", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise RendezvousConfigError(f"etcd {name} file {path!r} does not exist")

    def describe(self) -> str:
        """Return ``"host:port,host:port"``."""
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)


@dataclass
class _Endpoint:
    host: str
    port: int
    channel: grpc.aio.Channel | None = None
    last_error: str = ""

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass
class _Stats:
    """Requests sent (unary calls, watch streams opened, keep-alive messages)."""

    requests: int = 0
    reconnects: int = 0
    max_request_bytes: int = 0
    by_method: dict[str, int] = field(default_factory=dict)

    def count(self, method: str, request: Any = None) -> None:
        self.requests += 1
        self.by_method[method] = self.by_method.get(method, 0) + 1
        if request is not None:
            self.max_request_bytes = max(self.max_request_bytes, request.ByteSize())


class EtcdClient(AsyncResource):
    """An etcd v3 client holding one gRPC channel per endpoint; use ``async with``.

    Requests go to the current endpoint. When it is unreachable the request is
    retried on the next one (round robin, short exponential backoff) until the
    call's deadline (``read_timeout``), then
    :class:`~aelastic.store.StoreConnectionError` is raised naming every endpoint
    tried and the last error. Safe to share between tasks of one event loop.
    """

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self._endpoints = [_Endpoint(h, p) for h, p in config.endpoints]
        self._index = 0
        self._token: tuple[tuple[str, str], ...] | None = None
        self._auth_lock = anyio.Lock()
        self._closed = False
        self.stats = _Stats()

    # -- lifecycle ---------------------------------------------------------------

    async def aclose(self) -> None:
        """Close every channel and free it, so that nothing of gRPC runs afterwards.

        Idempotent; shielded from cancellation, bounded (5 s). grpc.aio stops its
        poller thread only when the last channel object is freed, and a cancelled call
        keeps its channel in a reference cycle (through its read coroutine's frame) until
        the garbage collector runs. A process that forks while that thread lives gives
        its child a gRPC that hangs or crashes in ``gc.collect()``, so the cycles are
        collected here, once, when a channel was open.
        """
        self._closed = True
        opened = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT):
            for ep in self._endpoints:
                channel, ep.channel = ep.channel, None
                if channel is not None:
                    opened = True
                    await channel.close(grace=None)
                    del channel
        if opened:
            gc.collect()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran (a closed client cannot be used again)."""
        return self._closed

    @property
    def endpoint(self) -> str:
        """The endpoint requests currently go to."""
        return self._endpoints[self._index].target

    # -- channel management ------------------------------------------------------

    def _credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.config.cacert),
            private_key=read(self.config.key),
            certificate_chain=read(self.config.cert),
        )

    def _channel(self) -> grpc.aio.Channel:
        require_asyncio()
        if self._closed:
            raise StoreConnectionError("the etcd client is closed", endpoint=self.endpoint)
        ep = self._endpoints[self._index]
        if ep.channel is None:
            if self.config.protocol == "https":
                ep.channel = grpc.aio.secure_channel(
                    ep.target, self._credentials(), options=_CHANNEL_OPTIONS
                )
            else:
                ep.channel = grpc.aio.insecure_channel(ep.target, options=_CHANNEL_OPTIONS)
        return ep.channel

    def _fail_over(self, error: str) -> None:
        if "last error:" in error:  # grpc's "failed to connect ...; last error: ...: <why>"
            error = error.rsplit(": ", 1)[-1]
        self._endpoints[self._index].last_error = error
        self._index = (self._index + 1) % len(self._endpoints)
        self.stats.reconnects += 1

    def failures(self) -> str:
        """``"host:port: why; ..."`` for every endpoint (the last error seen on each)."""
        return "; ".join(f"{ep.target}: {ep.last_error or 'no answer'}" for ep in self._endpoints)

    def _unreachable(self, waited: float) -> StoreConnectionError:
        return StoreConnectionError(
            f"etcd unreachable for {waited:.1f}s ({self.failures()}); check the endpoint "
            "and that etcd is running",
            endpoint=self.config.describe(),
        )

    async def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        if self.config.username is None:
            return None
        if self._token is None:
            async with self._auth_lock:
                if self._token is None:
                    stub = rpc.AuthStub(self._channel())
                    reply = await _grpc(
                        stub.Authenticate(
                            rpc.AuthenticateRequest(
                                name=self.config.username, password=self.config.password
                            ),
                            timeout=self.config.read_timeout,
                        )
                    )
                    self._token = (("token", reply.token),)
        return self._token

    async def _retrying(
        self,
        what: str,
        attempt: Callable[[grpc.aio.Channel, Any, float], Awaitable[_T]],
        deadline: float | None = None,
    ) -> _T:
        """Run ``attempt(channel, metadata, timeout)`` with failover until ``deadline``."""
        start = anyio.current_time()
        if deadline is None:
            deadline = start + self.config.read_timeout
        delay = 0.05
        while True:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                raise self._unreachable(anyio.current_time() - start)
            try:
                metadata = await self._metadata()
                return await attempt(self._channel(), metadata, remaining)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code is grpc.StatusCode.UNAUTHENTICATED and self._token is not None:
                    self._token = None  # expired token: authenticate again
                    continue
                if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    self._endpoints[self._index].last_error = "deadline exceeded"
                    raise self._unreachable(anyio.current_time() - start) from None
                if code not in _RETRYABLE:
                    raise EtcdRequestError(
                        f"etcd refused {what}: {code.name}: {exc.details()}",
                        code=code.name,
                        endpoint=self.endpoint,
                    ) from None
                self._fail_over(f"{code.name}: {exc.details()}")
            await anyio.sleep(min(delay, max(0.0, deadline - anyio.current_time())))
            delay = min(delay * 2, 1.0)

    async def _unary(self, method: str, request: Any, deadline: float | None = None) -> Any:
        async def attempt(channel: grpc.aio.Channel, metadata: Any, timeout: float) -> Any:  # noqa: ASYNC109
            stub_cls = rpc.LeaseStub if method.startswith("Lease") else rpc.KVStub
            call = getattr(stub_cls(channel), method)
            self.stats.count(method, request)
            return await _grpc(call(request, timeout=timeout, metadata=metadata))

        return await self._retrying(method, attempt, deadline)

    # -- KV ----------------------------------------------------------------------

    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        count_only: bool = False,
        keys_only: bool = False,
        limit: int = 0,
        sort_by_create: bool = False,
    ) -> Any:
        """Return the ``RangeResponse`` for ``[key, range_end)`` (or ``key`` alone)."""
        return await self._unary(
            "Range", range_request(key, range_end, count_only, keys_only, limit, sort_by_create)
        )

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> Any:
        """Put ``key`` = ``value`` (attached to ``lease`` when non-zero)."""
        return await self._unary("Put", rpc.PutRequest(key=key, value=value, lease=lease))

    async def delete(self, key: bytes, range_end: bytes | None = None) -> Any:
        """Delete ``key`` (or ``[key, range_end)``); return the ``DeleteRangeResponse``."""
        request = rpc.DeleteRangeRequest(key=key)
        if range_end is not None:
            request.range_end = range_end
        return await self._unary("DeleteRange", request)

    async def read(self, keys: Sequence[bytes]) -> tuple[list[Any], int]:
        """Each of ``keys``' ``RangeResponse``, all at one revision, and that revision.

        Plain ``Range`` requests, never a read-only transaction: etcd 3.5.0-3.5.4 panic
        and exit when a client cancels a read-only transaction (or its deadline passes)
        while etcd applies it (etcd#14110, fixed in 3.5.5), and a request of aelastic's
        is cancelled whenever its caller is. The first key is read at the current
        revision, the others at that revision: the same snapshot a transaction reads.
        """
        replies: list[Any] = []
        revision = 0
        for key in keys:
            request = range_request(key)
            request.revision = revision
            replies.append(await self._unary("Range", request))
            revision = revision or int(replies[0].header.revision)
        return replies, revision

    async def txn(
        self, compare: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> Any:
        """Run one transaction that writes; ops are ``RequestOp`` messages (see
        :func:`op_put` etc.).

        Raises:
            ValueError: the transaction only reads (use :meth:`read`: see why there).
        """
        if _reads_only([*success, *failure]):
            raise ValueError("a read-only etcd transaction: use EtcdClient.read (etcd#14110)")
        request = rpc.TxnRequest(
            compare=list(compare), success=list(success), failure=list(failure)
        )
        return await self._unary("Txn", request)

    # -- leases ------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> int:
        """Grant a lease of ``ttl`` seconds (etcd's clock); return its id."""
        reply = await self._unary("LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl, ID=0))
        if reply.error:
            raise StoreError(f"etcd refused a lease: {reply.error}", endpoint=self.endpoint)
        return int(reply.ID)

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke ``lease_id``, deleting its keys at once. A missing lease is not an error."""
        try:
            await self._unary("LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))
        except EtcdRequestError as exc:
            if exc.code != "NOT_FOUND":
                raise

    async def keep_alive(
        self,
        lease_id: int,
        ttl: int,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Refresh ``lease_id`` every ``ttl/3`` seconds until cancelled.

        Survives etcd restarts and endpoint failover (etcd keeps leases across
        restarts). Returns normally, without raising, when etcd reports the lease
        gone (TTL 0): the caller decides what losing its lease means.
        """
        interval = max(ttl / 3.0, 0.1)
        started = False
        delay = 0.05
        while True:
            call = None
            try:
                call = rpc.LeaseStub(self._channel()).LeaseKeepAlive(
                    metadata=await self._metadata()
                )
                while True:
                    self.stats.count("LeaseKeepAlive")
                    await _grpc(call.write(rpc.LeaseKeepAliveRequest(ID=lease_id)))
                    with anyio.fail_after(self.config.read_timeout):
                        reply = await _grpc(call.read())
                    if reply is grpc.aio.EOF:
                        raise StoreConnectionError(
                            "keep-alive stream ended", endpoint=self.endpoint
                        )
                    if reply.TTL <= 0:
                        log.warning("etcd lease %x expired", lease_id)
                        return
                    delay = 0.05
                    if not started:
                        started = True
                        task_status.started()
                    await anyio.sleep(interval)
            except (
                grpc.aio.AioRpcError,
                StoreConnectionError,
                TimeoutError,
                _StreamFinished,
            ) as exc:
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                log.debug("lease keep-alive to %s failed (%s); retrying", self.endpoint, detail)
                self._fail_over(str(detail))
            finally:
                if call is not None:
                    call.cancel()
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- watches -----------------------------------------------------------------

    def watch(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        start_revision: int,
        no_delete: bool = False,
        no_put: bool = False,
    ) -> EtcdWatch:
        """Watch ``key`` (or ``[key, range_end)``) from ``start_revision`` (inclusive).

        Use as ``async with client.watch(...) as w: events = await w.next()``.
        """
        return EtcdWatch(self, key, range_end, start_revision, no_delete, no_put)


class EtcdWatch:
    """One watch stream that survives reconnects without losing events.

    After a connection loss the watch is created again (on the next endpoint if
    needed) from the revision after the last event delivered, so nothing is
    missed or delivered twice. Raises :class:`EtcdCompactedError` when that
    revision was compacted. Blocks without limit: bound it with ``fail_after``.
    """

    def __init__(
        self,
        client: EtcdClient,
        key: bytes,
        range_end: bytes | None,
        start_revision: int,
        no_delete: bool,
        no_put: bool,
    ) -> None:
        self._client = client
        self._key = key
        self._range_end = range_end
        self._next_revision = start_revision
        self._filters = [rpc.WatchCreateRequest.NODELETE] if no_delete else []
        if no_put:
            self._filters.append(rpc.WatchCreateRequest.NOPUT)
        self._call: Any = None

    async def __aenter__(self) -> EtcdWatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._close()

    def _close(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def _open(self) -> None:
        client = self._client
        request = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=self._key,
                range_end=self._range_end or b"",
                start_revision=self._next_revision,
                filters=self._filters,
            )
        )
        client.stats.count("Watch", request)
        call = rpc.WatchStub(client._channel()).Watch(metadata=await client._metadata())
        self._call = call
        await _grpc(call.write(request))

    async def next(self) -> list[Any]:
        """Return the next non-empty batch of ``mvccpb.Event`` messages."""
        delay = 0.05
        while True:
            try:
                if self._call is None:
                    await self._open()
                reply = await _grpc(self._call.read())
                if reply is grpc.aio.EOF:
                    raise StoreConnectionError("watch stream ended", endpoint=self._client.endpoint)
                if reply.compact_revision:
                    self._close()
                    raise EtcdCompactedError(
                        f"revision {self._next_revision} compacted (now {reply.compact_revision})",
                        endpoint=self._client.endpoint,
                    )
                if reply.canceled:
                    self._close()
                    raise StoreError(
                        f"etcd cancelled the watch: {reply.cancel_reason}",
                        endpoint=self._client.endpoint,
                    )
                if reply.events:
                    self._next_revision = reply.events[-1].kv.mod_revision + 1
                    return list(reply.events)
                delay = 0.05
                continue
            except (grpc.aio.AioRpcError, StoreConnectionError, _StreamFinished) as exc:
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                if isinstance(exc, grpc.aio.AioRpcError) and exc.code() not in _RETRYABLE:
                    self._close()
                    raise StoreError(
                        f"etcd watch failed: {exc.code().name}: {detail}",
                        endpoint=self._client.endpoint,
                    ) from None
                log.debug("watch on %r lost (%s); re-watching", self._key, detail)
                self._close()
                self._client._fail_over(str(detail))
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)


# -- request builders ---------------------------------------------------------------


async def _grpc(awaitable: Awaitable[_T]) -> _T:
    """Await a grpc.aio call, its stream's read or write, so that an anyio cancel scope
    around it works.

    grpc answers a task cancelled while it waits by cancelling the RPC and raising a new
    ``CancelledError`` without the cancel scope's message, so anyio (which recognises
    its cancellations by that message) let it through ``move_on_after`` and
    ``fail_after`` as an unexplained cancellation. After such an error this yields once:
    a cancelled scope delivers its own cancellation there, which anyio then catches;
    any other cancellation propagates as it came."""
    try:
        return await awaitable
    except asyncio.CancelledError:
        await anyio.lowlevel.checkpoint()
        raise


def _reads_only(ops: Sequence[Any]) -> bool:
    """Whether ``ops`` (``RequestOp`` messages, nested transactions included) only read:
    etcd then runs the transaction as a read-only one (``isTxnReadonly``)."""
    for op in ops:
        if op.HasField("request_put") or op.HasField("request_delete_range"):
            return False
        if op.HasField("request_txn"):
            inner = op.request_txn
            if not _reads_only([*inner.success, *inner.failure]):
                return False
    return True


def range_request(
    key: bytes,
    range_end: bytes | None = None,
    count_only: bool = False,
    keys_only: bool = False,
    limit: int = 0,
    sort_by_create: bool = False,
) -> Any:
    """Build a ``RangeRequest``."""
    request = rpc.RangeRequest(key=key, count_only=count_only, keys_only=keys_only, limit=limit)
    if range_end is not None:
        request.range_end = range_end
    if sort_by_create:
        request.sort_target = rpc.RangeRequest.CREATE
        request.sort_order = rpc.RangeRequest.ASCEND
    return request


def op_range(key: bytes, range_end: bytes | None = None, *, count_only: bool = False) -> Any:
    """A ``RequestOp`` reading ``key`` (or a range)."""
    return rpc.RequestOp(request_range=range_request(key, range_end, count_only))


def op_put(key: bytes, value: bytes, lease: int = 0) -> Any:
    """A ``RequestOp`` writing ``key``."""
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes, range_end: bytes | None = None) -> Any:
    """A ``RequestOp`` deleting ``key`` (or a range)."""
    request = rpc.DeleteRangeRequest(key=key)
    if range_end is not None:
        request.range_end = range_end
    return rpc.RequestOp(request_delete_range=request)


def op_txn(compare: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()) -> Any:
    """A ``RequestOp`` running a nested transaction."""
    return rpc.RequestOp(
        request_txn=rpc.TxnRequest(
            compare=list(compare), success=list(success), failure=list(failure)
        )
    )


def cmp_version(key: bytes, version: int, result: str = "==") -> Any:
    """Compare ``key``'s version (0 = missing)."""
    return rpc.Compare(key=key, target=rpc.Compare.VERSION, version=version, result=_RESULT[result])


def cmp_mod(key: bytes, revision: int, result: str = "==") -> Any:
    """Compare ``key``'s modification revision."""
    return rpc.Compare(
        key=key, target=rpc.Compare.MOD, mod_revision=revision, result=_RESULT[result]
    )


def cmp_value(key: bytes, value: bytes, result: str = "==") -> Any:
    """Compare ``key``'s value."""
    return rpc.Compare(key=key, target=rpc.Compare.VALUE, value=value, result=_RESULT[result])


_RESULT = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}


def jitter(seconds: float) -> float:
    """Return ``seconds`` randomised by +-20% (spreads retries of many nodes)."""
    return seconds * (0.8 + 0.4 * random.random())
