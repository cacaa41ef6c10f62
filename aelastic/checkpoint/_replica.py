"""Peer copies of checkpoints (``--checkpoint-replicas N``): a lost node's ranks resume.

Each agent of a job with several nodes serves a TCP listener on an ephemeral port and
announces it in the round's store (``aelastic/checkpoint/peer/<group rank>``). In the
background it copies the newest step complete for its ranks to the agents of the next
``N`` group ranks (``g+1 .. g+N`` modulo the number of nodes), which keep the two newest
steps of those ranks in their own memory directory, in the same layout as their own
(so ``load(rank=...)`` reads them like any other file). When a round starts, before the
workers do, the agents agree on the step to resume from and on which files each fetches
from which peer (``_resume``): a node that replaces a lost one, or joins a job that
grows, gets the state its ranks read from its peers' memory (:meth:`Replicas.fetch`).

The wire format is a JSON header line, then the raw bytes of the files it lists, the
receiver's ``"held"`` once it holds them all, and the sender's trailer saying whether
they were whole (a file taken over by a worker's save while it was sent is not)::

    {"op": "push", "step": 40, "world": 2, "files": [[1, 1048576]]}\\n<bytes>
        <- "held"\\n  -> {"whole": true}\\n  <- "ok"\\n
    {"op": "fetch", "ranks": [1], "step": 40, "world": 2}\\n
        <- {"world": 2, "files": [[1, n]]}\\n<bytes>  -> "held"\\n  <- {"whole": true}\\n

Nothing here blocks the event loop. The bytes go by ``sendfile`` and are received
straight into a mapping of the destination file (``_wire``); a copy of a newer step
writes into the pages of the older step it replaces, and a new file's pages are
allocated in a worker thread before its bytes arrive (``_landing``). Every wait for a peer
has a timeout. A peer that is closed, dead or too slow only costs its copy: errors are
logged, never raised. A file appears by ``rename`` once all its bytes arrived whole, so
a copy cut short leaves no partial file behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from .._dataclass import dataclass
from .._tasks import background_tasks
from ..store import Store, StoreError
from . import _layout as L
from ._landing import Landed, Landing
from ._wire import PeerConn, connect

__all__ = ("PeerRound", "Replicas", "announce_no_replicas", "open_replicas")

log = logging.getLogger("aelastic.checkpoint")

KEY = "aelastic/checkpoint/peer"
#: Longest wait for one header or chunk from a peer, and for a peer's address.
IO_TIMEOUT = 10.0
#: How often the agent looks for a newer step of its ranks to copy.
PUSH_INTERVAL = 0.5

#: What a failed exchange with a peer raises: the copy is skipped.
_PEER_ERRORS = (
    OSError,
    TimeoutError,
    ValueError,
    KeyError,
    TypeError,
    StoreError,
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.DelimiterNotFound,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


def _why(exc: BaseException) -> str:
    """``exc`` for a log line (a timeout or a closed stream has no message of its own)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {IO_TIMEOUT:.0f} s"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def announce_no_replicas(store: Store, group_rank: int) -> None:
    """What an agent without peer copies (``--checkpoint-replicas 0``) announces: no
    listener, nothing held, so the others neither wait for it nor connect to it."""
    await store.set(f"{KEY}/{group_rank}", json.dumps({"port": None, "holds": False}))


@dataclass(frozen=True)
class PeerRound:
    """What the replicas need of a rendezvous round."""

    store: Store
    group_rank: int
    group_world_size: int
    #: the global ranks of this node's workers in the round
    ranks: tuple[int, ...]
    #: (address to bind, address to announce) of this node's listener
    bind: str
    advertised: str


#: The largest DCP ``.metadata`` a peer accepts on its own (it describes every tensor's
#: shards: megabytes for the largest models).
_MAX_METADATA = 1 << 30


def _metadata_size(value: Any, required: bool) -> int:
    """A header's ``.metadata`` size, checked (0: none, where not ``required``). Raises
    ValueError for a size out of bounds: a garbled header must not allocate gigabytes."""
    size = int(value or 0)
    if not (1 if required else 0) <= size <= _MAX_METADATA:
        raise ValueError(f"a metadata file of {size} bytes")
    return size


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _newest(memory_dir: str, ranks: Iterable[int], after: int | None = None) -> dict[int, int]:
    """``{step: world}`` complete for ``ranks`` in ``memory_dir``, newer than ``after``."""
    steps = L.complete_steps(L.scan(memory_dir), ranks)
    return {s: w for s, w in steps.items() if after is None or s > after}


@dataclass(frozen=True)
class _Opened:
    """A step's rank files opened for sending, then its DCP ``.metadata`` if it has one
    (the last entry when ``metadata``): an open file's bytes stay readable if the step is
    deleted while they are sent."""

    paths: tuple[str, ...]
    fds: tuple[int, ...]
    sizes: tuple[int, ...]
    metadata: bool = False

    def header(self, ranks: Sequence[int]) -> dict[str, Any]:
        """The header's ``files`` (``[[rank, size], ...]``) and, for a DCP step whose
        ``.metadata`` is here, ``metadata`` (its size)."""
        sizes = self.sizes[:-1] if self.metadata else self.sizes
        out: dict[str, Any] = {
            "files": [[rank, size] for rank, size in zip(ranks, sizes, strict=True)]
        }
        if self.metadata:
            out["metadata"] = self.sizes[-1]
        return out

    def still_named(self) -> bool:
        """Whether each file still has its name (blocking). A worker's save renames its
        oldest step's file away before it overwrites it (``_buffer``), and a replica
        taking over an old step's pages does the same (:func:`_target`): a name still in
        place after a copy means the bytes copied were the step's, whole."""
        for path, fd in zip(self.paths, self.fds, strict=True):
            try:
                if os.stat(path).st_ino != os.fstat(fd).st_ino:
                    return False
            except FileNotFoundError:
                return False
        return True

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _open_files(memory_dir: str, step: int, world: int, ranks: Sequence[int]) -> _Opened:
    """The step's rank files, opened (blocking; all or none), and its DCP ``.metadata``
    when the step has one here. Raises OSError."""
    paths = [L.rank_file(memory_dir, step, rank, world) for rank in ranks]
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        metadata = os.path.join(L.step_dir(memory_dir, step), L.METADATA)
        with contextlib.suppress(FileNotFoundError):  # not a DCP step, or not its node's
            fds.append(os.open(metadata, os.O_RDONLY | os.O_CLOEXEC))
            paths.append(metadata)
        sizes = tuple(os.fstat(fd).st_size for fd in fds)
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return _Opened(tuple(paths), tuple(fds), sizes, len(fds) > len(ranks))


async def _send_files(conn: PeerConn, opened: _Opened) -> bool:
    """The bytes of each file, in order, as many as the header announced; once the
    receiver holds them all, the trailer ``{"whole": ...}``: false when a file was taken
    over meanwhile (the receiver drops the copy). Returns that. Raises OSError if a
    file shrank (the exchange is cut short: the receiver drops what it got)."""
    for fd, size in zip(opened.fds, opened.sizes, strict=True):
        await conn.send_file(fd, size)
    if (await conn.receive_line()) != "held":
        raise ValueError("the peer did not say it holds the bytes")
    whole = await anyio.to_thread.run_sync(opened.still_named)
    await conn.send_line({"whole": whole})
    return whole


async def _receive_files(
    conn: PeerConn, landing: Landing, step: int, world: int, header: Any
) -> int | None:
    """Receive the files ``header`` announces (``files``, then ``metadata``: a DCP step's
    ``.metadata``) into ``landing``'s directory and, if the trailer says they were whole,
    give them their names (temporary files, then renames: a file with the final name is
    whole; an existing one is replaced). Returns the bytes received, None when the
    sender's files changed while it sent them (nothing is kept).

    Each file's pages are allocated in a worker thread before its bytes arrive, a
    chunk ahead of them (:func:`_receive_file`). Cancellation or an error (``ENOSPC``:
    not enough shared memory) removes the temporary files.
    """
    files = header["files"]
    metadata = bytearray(_metadata_size(header.get("metadata"), required=False))
    landed: list[Landed] = []
    whole = False
    try:
        for rank, size in files:
            f = await anyio.to_thread.run_sync(landing.open, int(rank), step, world, int(size))
            landed.append(f)
            if f.mm is not None:
                await _receive_file(conn, landing, f, int(size))
        if metadata:
            await conn.receive_into(memoryview(metadata))
        await conn.send_line("held")
        whole = (await conn.receive_line()) == {"whole": True}
    finally:
        # bounded (renames or unlinks, unmaps), and the pages must not leak: shielded
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(landing.finish, landed, whole)
            if whole and metadata:  # after the rank files: a reader needs both
                await anyio.to_thread.run_sync(landing.put_metadata, step, bytes(metadata))
    return sum(int(size) for _, size in files) + len(metadata) if whole else None


#: Bytes a new file's pages are allocated by at a time, ahead of the bytes arriving:
#: the first chunk (allocated while nothing arrives) small, each next one twice the last
#: up to the most.
ALLOCATE_FIRST, ALLOCATE_MOST = 1 << 20, 16 << 20


async def _receive_file(conn: PeerConn, landing: Landing, f: Landed, size: int) -> None:
    """Receive ``size`` bytes into ``f``'s mapping. Where its pages are new, a worker
    thread allocates the next chunk of them while the bytes of this one arrive
    (the two took turns before: a fetch into empty memory spent 0.4-0.5 of its time
    allocating pages). Raises what the connection or the allocation (OSError) raises;
    returns or raises only once no thread touches the mapping."""
    if f.mm is None:
        return
    failed: list[OSError] = []

    async def allocate(end: int) -> None:
        try:
            await anyio.to_thread.run_sync(landing.allocate, f, end)
        except OSError as exc:
            failed.append(exc)

    chunk = ALLOCATE_FIRST
    with memoryview(f.mm)[:size] as view:
        received = 0
        while received < size:
            if f.allocated <= received:  # nothing allocated ahead: this chunk, now
                await allocate(min(size, received + chunk))
            if failed:
                raise failed[0]
            ready = min(size, f.allocated)
            chunk = min(2 * chunk, ALLOCATE_MOST)
            # the thread is waited for when the block ends, even when it is cancelled
            async with background_tasks() as tg:
                if ready < size:
                    tg.start_soon(allocate, min(size, ready + chunk))
                await conn.receive_into(view[received:ready])
            received = ready


class Replicas:
    """This node's side of the peer copies: see :func:`open_replicas`."""

    def __init__(
        self, memory_dir: str, copies: int, tg: anyio.abc.TaskGroup, landing: Landing
    ) -> None:
        self.memory_dir = memory_dir
        self._landing = landing
        self.copies = copies
        self._tg = tg
        self._round: PeerRound | None = None
        self._port: int | None = None
        #: the newest step copied to the current round's peers
        #: the round and step pushed last, and whether its DCP ``.metadata`` went too
        self._pushed: tuple[PeerRound, int, bool] | None = None
        #: the global ranks of this node's workers (a copy of them is refused)
        self._own: frozenset[int] = frozenset()
        #: the newest step copied to a peer, and the last fetched from one
        self.pushed_step: int | None = None
        self.fetched_step: int | None = None

    def status(self) -> dict[str, Any]:
        return {
            "copies": self.copies,
            "port": self._port,
            "pushed_step": self.pushed_step,
            "fetched_step": self.fetched_step,
        }

    # -- a round starts -------------------------------------------------------------------

    async def join(self, peer_round: PeerRound) -> None:
        """Start this node's listener (once) and announce it in the round's store; copies
        to peers pause until :meth:`started`. What the round resumes from, and what this
        node fetches for it (:meth:`fetch`), the agent decides (``_resume``).

        Raises only :class:`~aelastic.store.StoreError` (the round's store is gone).
        Cancellation: stops.
        """
        self._round = None
        self._own = frozenset(peer_round.ranks)
        if self._port is None:
            self._port = await self._tg.start(self._serve, peer_round.bind)
        pr = peer_round
        # the round's start may have dropped steps: their mappings go too
        await anyio.to_thread.run_sync(self._landing.sweep)
        announced = {"host": pr.advertised, "port": self._port}
        await pr.store.set(f"{KEY}/{pr.group_rank}", json.dumps(announced))

    async def fetch(
        self, pr: PeerRound, peer: int, step: int, world: int, ranks: Sequence[int]
    ) -> int | None:
        """Download ``ranks``' files of ``step`` (saved by ``world`` ranks) from node
        ``peer``, with the step's DCP metadata if the peer has it (``ranks`` empty: only
        that). Returns the bytes received; None when the peer failed (logged, not
        raised). Cancellation: stops (a file being received is removed)."""
        try:
            async with self._connect(pr.store, peer) as conn:
                request = {"op": "fetch", "ranks": list(ranks), "step": step, "world": world}
                await conn.send_line(request)
                header = await conn.receive_line()
                if len(header["files"]) != len(ranks) or int(header["world"]) != world:
                    raise ValueError(f"the peer no longer holds step {step}")
                size = await _receive_files(conn, self._landing, step, world, header)
                if size is None:
                    raise ValueError(f"the peer's files of step {step} changed while it sent them")
        except _PEER_ERRORS as exc:
            why = _why(exc)
            log.error(
                "cannot fetch checkpoint step %d of ranks %s from node %d: %s",
                step, list(ranks), peer, why,
            )  # fmt: skip
            return None
        log.info(
            "checkpoint step %d of ranks %s fetched from node %d (%d bytes)",
            step, list(ranks), peer, size,
        )  # fmt: skip
        self.fetched_step = step if self.fetched_step is None else max(self.fetched_step, step)
        return size

    def started(self, peer_round: PeerRound) -> None:
        """The round's workers start: copy their steps to the peers from now on."""
        self._round = peer_round

    async def _address(self, store: Store, peer: int) -> dict[str, Any]:
        """What ``peer`` announced in the round's store (waits up to ``IO_TIMEOUT``)."""
        address = json.loads(await store.get(f"{KEY}/{peer}", timeout=IO_TIMEOUT))
        if not isinstance(address, dict):
            raise ValueError(f"not an address: {address!r}")
        return address

    @contextlib.asynccontextmanager
    async def _connect(
        self, store: Store, peer: int, address: dict[str, Any] | None = None
    ) -> AsyncIterator[PeerConn]:
        if address is None:
            address = await self._address(store, peer)
        async with connect(address["host"], int(address["port"]), IO_TIMEOUT) as conn:
            yield conn

    # -- copying to the next nodes --------------------------------------------------------

    async def push_every(self, interval: float = PUSH_INTERVAL) -> None:
        """Every ``interval`` seconds, copy a newer step of this node's ranks to the peers."""
        while True:
            await anyio.sleep(interval)
            await self.push()

    async def push(self) -> None:
        """Copy the newest step complete for the round's ranks to the next ``copies``
        nodes, at the same time, if it was not copied yet. A peer that fails is skipped
        (it gets the next step). Cancellation: stops (peers drop partial files)."""
        pr = self._round
        if pr is None or pr.group_world_size < 2 or not pr.ranks:
            return
        complete = await anyio.to_thread.run_sync(_newest, self.memory_dir, pr.ranks)
        step = max(complete, default=None)
        if step is None:
            return
        if self._pushed is not None and self._pushed[:2] == (pr, step):
            if not self._pushed[2]:  # DCP's coordinator may write it after the push
                await self._push_late_metadata(pr, step)
            return
        world = complete[step]
        try:
            opened = await anyio.to_thread.run_sync(
                _open_files, self.memory_dir, step, world, pr.ranks
            )
        except OSError:  # dropped or replaced while we looked: the next pass sees why
            return
        count = min(self.copies, pr.group_world_size - 1)
        targets = [(pr.group_rank + i) % pr.group_world_size for i in range(1, count + 1)]
        try:
            async with anyio.create_task_group() as tg:
                for target in targets:
                    tg.start_soon(self._push_to, pr, target, step, world, opened)
        finally:
            opened.close()
        self._pushed = (pr, step, opened.metadata)
        self.pushed_step = step

    async def _push_late_metadata(self, pr: PeerRound, step: int) -> None:
        """Send the ``.metadata`` that DCP's coordinator wrote after ``step`` was pushed
        (the rank files are written first) to the same peers; nothing when there is none
        (not a DCP step, or not this node's coordinator). A peer that fails is skipped."""
        path = os.path.join(L.step_dir(self.memory_dir, step), L.METADATA)
        try:
            data = await anyio.to_thread.run_sync(_read_file, path)
        except FileNotFoundError:
            return
        count = min(self.copies, pr.group_world_size - 1)
        targets = [(pr.group_rank + i) % pr.group_world_size for i in range(1, count + 1)]

        async def send(target: int) -> None:
            try:
                address = await self._address(pr.store, target)
                if address.get("port") is None:
                    return
                async with self._connect(pr.store, target, address) as conn:
                    await conn.send_line({"op": "metadata", "step": step, "size": len(data)})
                    await conn.send(data)
                    if (await conn.receive_line()) != "ok":
                        raise ValueError("the peer did not confirm the metadata")
            except _PEER_ERRORS as exc:
                why = _why(exc)
                log.warning("cannot copy step %d's metadata to node %d: %s", step, target, why)

        async with anyio.create_task_group() as tg:
            for target in targets:
                tg.start_soon(send, target)
        self._pushed = (pr, step, True)

    async def _push_to(
        self, pr: PeerRound, target: int, step: int, world: int, opened: _Opened
    ) -> None:
        try:
            address = await self._address(pr.store, target)
            if address.get("port") is None:
                log.debug("node %d keeps no copies (--checkpoint-replicas 0)", target)
                return
            async with self._connect(pr.store, target, address) as conn:
                header = {"op": "push", "step": step, "world": world, **opened.header(pr.ranks)}
                await conn.send_line(header)
                if not await _send_files(conn, opened):
                    # saved over twice while it was sent (a copy slower than two steps)
                    log.debug("checkpoint step %d changed while it was copied", step)
                    return
                if (await conn.receive_line()) != "ok":
                    raise ValueError("the peer did not confirm the copy")
            log.debug("checkpoint step %d copied to node %d", step, target)
        except _PEER_ERRORS as exc:
            log.warning("cannot copy checkpoint step %d to node %d: %s", step, target, _why(exc))

    # -- serving the peers ----------------------------------------------------------------

    def _prune(self, ranks: Sequence[int]) -> None:
        """Keep the two newest steps of ``ranks``; unmap what goes (blocking)."""
        L.prune(self.memory_dir, ranks)
        self._landing.sweep()

    async def _serve(
        self, bind: str, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host=bind or None, local_port=0)
        async with listener:
            port = listener.listeners[0].extra(SocketAttribute.local_port)
            log.debug("serving checkpoint replicas on %s:%d", bind or "*", port)
            task_status.started(port)
            # accepted here, not by the listener: the connections are plain sockets
            # (``_wire``), which anyio's streams would read from on their own
            async with anyio.create_task_group() as tg:
                for each in listener.listeners:
                    tg.start_soon(self._accept, each.extra(SocketAttribute.raw_socket), tg)

    async def _accept(self, listening: socket.socket, tg: anyio.abc.TaskGroup) -> None:
        while True:
            await anyio.wait_readable(listening)
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            tg.start_soon(self._handle, PeerConn(sock, IO_TIMEOUT))

    async def _handle(self, conn: PeerConn) -> None:
        """One peer's request. Never raises: a broken exchange only loses its copy."""
        with contextlib.closing(conn):
            # A stray connection (a port scan, a probe) is no peer: a debug line, no more.
            try:
                request = await conn.receive_line()
            except _PEER_ERRORS as exc:
                log.debug("checkpoint listener: ignored a connection (%s)", _why(exc))
                return
            op = request.get("op") if isinstance(request, dict) else None
            if op not in ("push", "fetch", "metadata"):
                log.debug("checkpoint listener: ignored a connection that is not a peer's")
                return
            try:
                if op == "push":
                    step, world = int(request["step"]), int(request["world"])
                    files = request["files"]
                    if self._own.intersection(int(rank) for rank, _ in files):
                        raise ValueError("a copy of this node's own ranks (an older round's)")
                    if await _receive_files(conn, self._landing, step, world, request) is None:
                        log.debug("the copy of checkpoint step %d changed while it was sent", step)
                        return
                    ranks = [int(rank) for rank, _ in files]
                    await anyio.to_thread.run_sync(self._prune, ranks)
                    await conn.send_line("ok")
                elif op == "fetch":
                    ranks = [int(r) for r in request["ranks"]]
                    await self._send_step(conn, int(request["step"]), int(request["world"]), ranks)
                elif op == "metadata":
                    step = int(request["step"])
                    data = bytearray(_metadata_size(request["size"], required=True))
                    await conn.receive_into(memoryview(data))
                    if await anyio.to_thread.run_sync(
                        os.path.isdir, L.step_dir(self.memory_dir, step)
                    ):
                        await anyio.to_thread.run_sync(
                            self._landing.put_metadata, step, bytes(data)
                        )
                    await conn.send_line("ok")
            except _PEER_ERRORS as exc:
                log.warning("a checkpoint exchange with a peer failed: %s", _why(exc))

    async def _send_step(self, conn: PeerConn, step: int, world: int, ranks: list[int]) -> None:
        """``ranks``' files of ``step`` saved by ``world`` ranks, and its DCP metadata if
        held here; a header without files when one of them is not held (any more)."""
        try:
            opened = await anyio.to_thread.run_sync(
                _open_files, self.memory_dir, step, world, ranks
            )
        except OSError:
            await conn.send_line({"world": world, "files": []})
            return
        try:
            await conn.send_line({"world": world, **opened.header(ranks)})
            await _send_files(conn, opened)
        finally:
            opened.close()


@contextlib.asynccontextmanager
async def open_replicas(
    memory_dir: str, copies: int, push_interval: float = PUSH_INTERVAL
) -> AsyncIterator[Replicas]:
    """Peer copies of the checkpoints in ``memory_dir`` to ``copies`` other nodes, looked
    for every ``push_interval`` seconds.

    The listener starts with the first round of several nodes (:meth:`Replicas.join`);
    copies run in the background until the block is left, which cancels them (a copy
    in progress is cut short; the peer drops the partial file) and closes the listener.
    """
    landing = Landing(memory_dir)
    try:
        async with background_tasks() as tg:
            replicas = Replicas(memory_dir, copies, tg, landing)
            tg.start_soon(replicas.push_every, push_interval)
            yield replicas
    finally:
        with anyio.CancelScope(shield=True):  # bounded: unmaps
            await anyio.to_thread.run_sync(landing.close)
