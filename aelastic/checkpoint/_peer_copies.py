"""Peer copies of checkpoints (``--checkpoint-peer-copies N``): a lost node's ranks resume.

Each agent of a job with several nodes serves a TCP listener on an ephemeral port and
announces it in the round's store (``aelastic/checkpoint/peer/<group rank>``). In the
background it copies the newest step complete for its ranks to the agents of the next
``N`` group ranks (``g+1 .. g+N`` modulo the number of nodes), which keep the two newest
steps of those ranks in their own memory directory, in the same layout as their own
(so ``load(rank=...)`` reads them like any other file). When a round starts, before the
workers do, the agents agree on the step to resume from and on which files each fetches
from which peer (``_resume``): a node that replaces a lost one, or joins a job that
grows, gets the state its ranks read from its peers' memory (:meth:`PeerCopies.fetch`).

Every connection starts with the job key's mutual challenge-response, and every JSON
line after it carries a MAC (``_peerauth``): a connection that does not prove it holds
the key is closed, and said once per address at WARNING. The key comes from
``--job-secret-file``, else the first agent to reach the round's store writes a random
one there (:func:`agree_key`; every later round keeps it). The listener binds to the
address the node announces, and starts only once the job saves (:meth:`PeerCopies.join`).

The wire format, after the handshake, is a JSON header line (the receiver answers
``"ready"``, or ``{"error": ..., "retry": ...}`` for a push it refuses, see
:func:`push_refusal`), then the raw bytes of the files it lists, the receiver's
``"held"`` once it holds them all, and the sender's trailer saying whether they were
whole (a file taken over by a worker's save while it was sent is not)::

    {"op": "push", "step": 40, "world": 2, "files": [[1, 1048576]]}\\n  <- "ready"\\n
        <bytes>  <- "held"\\n  -> {"whole": true}\\n  <- "ok"\\n
    {"op": "fetch", "ranks": [1], "step": 40, "world": 2}\\n
        <- {"world": 2, "files": [[1, n]]}\\n<bytes>  -> "held"\\n  <- {"whole": true}\\n

Nothing here blocks the event loop. The bytes go by ``sendfile`` and are received
straight into a mapping of the destination file (``_wire``); a copy of a newer step
writes into the pages of the older step it replaces, and a new file's pages are
allocated in a worker thread before its bytes arrive (``_landing``). Every wait for a peer
has a timeout. A peer that is closed, dead or too slow only costs its copy: errors are
logged, never raised. A file appears by ``rename`` once all its bytes arrived whole, so
a copy cut short leaves no partial file behind.

A DCP step's ``.metadata`` travels with its rank files: without a shared
``--checkpoint-dir`` only the coordinator's node has it, and a node that loads a
resharded state needs it. DCP's coordinator writes it after every rank wrote its file, so
a step is often pushed before it has one; the agent then sends the ``.metadata`` on its
own at the next push interval.
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
from . import _peerauth as A
from ._landing import Landed, Landing
from ._wire import PeerConn, connect, server_handshake

__all__ = (
    "PeerRound",
    "PeerCopies",
    "agree_key",
    "announce_no_peer_copies",
    "open_peer_copies",
    "push_refusal",
)

log = logging.getLogger("aelastic.checkpoint")

KEY = "aelastic/checkpoint/peer"
#: Longest wait for one header or chunk from a peer, and for a peer's address.
IO_TIMEOUT = 10.0
#: How often the agent looks for a newer step of its ranks to copy.
PUSH_INTERVAL = 0.5
#: Where the agents agree on the job's key when no ``--job-secret-file`` gives it, and
#: where the first agent that sees its workers' save says the job saves (every agent's
#: listener starts then).
KEY_KEY = "aelastic/checkpoint/key"
SAVED_KEY = "aelastic/checkpoint/saved"

#: The bounds of a push (:func:`push_refusal`). A rank's file may be at most
#: ``PUSH_SIZE_FACTOR`` times the largest file of the receiver's own newest step (or
#: ``PUSH_SIZE_FLOOR``, when that is more: small states); what the peers leave on a node,
#: at most ``PEER_HELD_FACTOR`` times ``--checkpoint-peer-copies`` times its own newest step
#: (the two newest steps of each pushed rank: ``KEEP``).
PUSH_SIZE_FACTOR = 4
PUSH_SIZE_FLOOR = 64 << 20
KEEP = 2
PEER_HELD_FACTOR = KEEP * PUSH_SIZE_FACTOR
MAX_PUSH_FILES = 4096
MAX_WORLD = 1 << 20
MAX_STEP = 10**12 - 1  # the 12 digits of a step's directory name
#: Peer addresses refused so far (each is logged once): at most this many remembered.
_REFUSED_MAX = 4096
#: Connections served at once: one more is closed at accept (a node has a few peers;
#: strangers that connect and say nothing each hold one until ``IO_TIMEOUT``).
MAX_CONNECTIONS = 64

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
    if isinstance(exc, A.PeerAuthError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _Refused(ValueError):
    """A peer refused a push (its one-line reason); ``retry``: try the step again later."""

    def __init__(self, reason: str, retry: bool) -> None:
        super().__init__(reason)
        self.retry = retry


async def agree_key(store: Store, known: bytes | None = None) -> bytes:
    """The job's key for peer connections, agreed through ``store``: the first agent to
    get there writes ``known`` (the key of the rounds before) or a new random one, and
    every agent reads what is there. Raises StoreError, ValueError (an empty value)."""
    proposal = known if known is not None else A.new_key().hex().encode()
    return A.parse_key(await store.compare_set(KEY_KEY, "", proposal))


def _whole(value: Any, low: int, high: int, what: str) -> int:
    """``value`` as a whole number in ``[low, high]``. Raises ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {repr(value)[:40]} is not a whole number in {low}..{high}")
    return value


def push_refusal(
    header: Any,
    own: Iterable[int],
    own_newest: dict[int, int],
    others_held: dict[int, int],
    copies: int,
) -> tuple[str, bool] | None:
    """Why a node refuses a push, and whether the pusher should try again later; None to
    take it. ``own``: the node's ranks in the round; ``own_newest``: ``{rank: bytes}`` of
    its own newest step; ``others_held``: ``{rank: bytes}`` of the other ranks' files it
    holds. The bounds: a step in ``0..MAX_STEP``, a world in ``1..MAX_WORLD``, 1 to
    ``MAX_PUSH_FILES`` distinct ranks in ``0..world-1`` that are not the node's own, each
    file at most :data:`PUSH_SIZE_FACTOR` times its own newest step's largest (at least
    :data:`PUSH_SIZE_FLOOR`), and all the peers' files it would then hold (this push
    counted twice: the step it keeps before it) at most :data:`PEER_HELD_FACTOR` times
    ``copies`` times its own newest step. A node with no step of its own refuses, to be
    tried again (its workers have not saved yet)."""
    if not isinstance(header, dict):
        return "not a push header", False
    try:
        _whole(header.get("step"), 0, MAX_STEP, "step")
        world = _whole(header.get("world"), 1, MAX_WORLD, "world")
        files = header.get("files")
        if not isinstance(files, list) or not 1 <= len(files) <= MAX_PUSH_FILES:
            raise ValueError(f"files: need 1..{MAX_PUSH_FILES} [rank, size] pairs")
        ranks, sizes = [], []
        for item in files:
            if not isinstance(item, list) or len(item) != 2:
                raise ValueError(f"files: {repr(item)[:40]} is not a [rank, size] pair")
            ranks.append(_whole(item[0], 0, world - 1, "rank"))
            sizes.append(_whole(item[1], 0, 1 << 62, "size"))
        if len(set(ranks)) != len(ranks):
            raise ValueError("a rank listed twice")
        _metadata_size(header.get("metadata"), required=False)
    except ValueError as exc:
        return f"a malformed push: {exc}", False
    mine = set(own)
    if mine.intersection(ranks):
        return "a copy of this node's own ranks (an older round's)", False
    if not own_newest:
        return "this node holds no step of its own yet (it takes copies once it saved)", True
    largest = max(PUSH_SIZE_FACTOR * max(own_newest.values()), PUSH_SIZE_FLOOR)
    if max(sizes) > largest:
        return (
            f"a file of {max(sizes)} bytes, more than this node takes ({largest}: "
            f"{PUSH_SIZE_FACTOR} x its own newest step's largest)"
        ), False
    total = PEER_HELD_FACTOR * max(copies, 1) * max(sum(own_newest.values()), PUSH_SIZE_FLOOR)
    pushed = set(ranks)
    after = sum(n for r, n in others_held.items() if r not in pushed) + 2 * sum(sizes)
    if after > total:
        return f"the peers' copies would take {after} bytes here, more than {total}", False
    return None


def _own_and_others(memory_dir: str, own: frozenset[int]) -> tuple[dict[int, int], dict[int, int]]:
    """``({rank: bytes} of own ranks in the own newest step, {rank: bytes} held of every
    other rank)`` (blocking: a scan)."""
    steps = L.scan(memory_dir)
    newest: dict[int, int] = {}
    others: dict[int, int] = {}
    for number in sorted(steps, reverse=True):
        for files in steps[number].ranks.values():
            for rank, size in files.items():
                if rank not in own:
                    others[rank] = others.get(rank, 0) + size
        if not newest and steps[number].holds_any(own):
            newest = {
                r: n for files in steps[number].ranks.values() for r, n in files.items() if r in own
            }
    return newest, others


async def announce_no_peer_copies(store: Store, group_rank: int) -> None:
    """What an agent without peer copies (``--checkpoint-peer-copies 0``) announces: no
    listener, nothing held, so the others neither wait for it nor connect to it."""
    await store.set(f"{KEY}/{group_rank}", json.dumps({"port": None, "holds": False}))


@dataclass(frozen=True)
class PeerRound:
    """What the peer copies need of a rendezvous round."""

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
        oldest step's file away before it overwrites it (``_buffer``), and a peer copy
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
                # released here: a traceback that keeps the slice would keep the
                # mapping exported, and its close would fail (found by the fuzzer)
                with view[received:ready] as part:
                    await conn.receive_into(part)
            received = ready


class PeerCopies:
    """This node's side of the peer copies: see :func:`open_peer_copies`."""

    def __init__(
        self,
        memory_dir: str,
        copies: int,
        tg: anyio.abc.TaskGroup,
        landing: Landing,
        key: bytes | None = None,
    ) -> None:
        self.memory_dir = memory_dir
        self._landing = landing
        self.copies = copies
        self._tg = tg
        self._round: PeerRound | None = None
        self._port: int | None = None
        #: ``--job-secret-file``'s key (None: agreed in each round's store), and the
        #: key in use (never logged)
        self._fixed_key = key
        self._key: bytes | None = key
        self._listening = anyio.Lock()
        #: the current round's wait for the job's first save (cancelled by the next round)
        self._waiter: anyio.CancelScope | None = None
        #: the round in which this agent said the job saves
        self._said_saved: PeerRound | None = None
        #: (round, step) being pushed, and the peers still to get it (tried again later)
        self._pending: tuple[PeerRound, int] | None = None
        self._left: set[int] = set()
        #: peer addresses whose refused connection was logged (once each)
        self._refused: set[str] = set()
        #: connections being served now (at most ``MAX_CONNECTIONS``)
        self._serving = 0
        #: the newest step copied to the current round's peers
        #: the round and step pushed last, and whether its DCP ``.metadata`` went too
        self._pushed: tuple[PeerRound, int, bool] | None = None
        #: the global ranks of this node's workers (a copy of them is refused)
        self._own: frozenset[int] = frozenset()
        #: the newest step copied to a peer, and the last fetched from one
        self.pushed_step: int | None = None
        self.fetched_step: int | None = None

    def _refuse(self, host: str, why: str) -> None:
        """Log a refused connection, once per peer address."""
        if host in self._refused or len(self._refused) >= _REFUSED_MAX:
            log.debug("checkpoint listener: refused a connection from %s: %s", host, why)
            return
        self._refused.add(host)
        log.warning(
            "checkpoint listener: refused a connection from %s: %s (said once per address; "
            "every agent of a job must hold the same key: --job-secret-file)",
            host, why,
        )  # fmt: skip

    def status(self) -> dict[str, Any]:
        return {
            "copies": self.copies,
            "port": self._port,
            "pushed_step": self.pushed_step,
            "fetched_step": self.fetched_step,
        }

    # -- a round starts -------------------------------------------------------------------

    async def join(self, peer_round: PeerRound) -> None:
        """Agree on the job's key (unless ``--job-secret-file`` gave it), start this
        node's listener if the job saves (this node holds a step, or an agent said so in
        the round's store; else once one does, in the background), and announce it in
        the round's store (a port of None with ``pending``: not started yet, a push is
        tried again later); copies to peers pause until :meth:`started`. What the round
        resumes from, and what this node fetches for it (:meth:`fetch`), the agent
        decides (``_resume``).

        Raises only :class:`~aelastic.store.StoreError` (the round's store is gone).
        Cancellation: stops.
        """
        self._round = None
        self._own = frozenset(peer_round.ranks)
        if self._waiter is not None:
            self._waiter.cancel()
            self._waiter = None
        pr = peer_round
        if self._fixed_key is None:
            try:
                self._key = await agree_key(pr.store, self._key)
            except ValueError as exc:
                raise StoreError(f"no usable checkpoint peer key in the store: {exc}") from None
        # the round's start may have dropped steps: their mappings go too
        await anyio.to_thread.run_sync(self._landing.sweep)
        if self._port is None and (
            bool(await anyio.to_thread.run_sync(L.scan, self.memory_dir))
            or await pr.store.check([SAVED_KEY])
        ):
            await self._listen(pr.bind)
        await self._announce(pr)
        if self._port is None:
            self._waiter = anyio.CancelScope()
            self._tg.start_soon(self._listen_once_saved, pr, self._waiter)

    async def _listen(self, bind: str) -> None:
        """Start the listener, once."""
        async with self._listening:
            if self._port is None:
                self._port = await self._tg.start(self._serve, bind)

    async def _announce(self, pr: PeerRound) -> None:
        announced = {"host": pr.advertised, "port": self._port, "pending": self._port is None}
        await pr.store.set(f"{KEY}/{pr.group_rank}", json.dumps(announced))

    async def _listen_once_saved(self, pr: PeerRound, scope: anyio.CancelScope) -> None:
        """Start the listener once an agent says the job saves (the round's store), and
        announce it. Ends with the round (``scope``) or its store."""
        with scope:
            try:
                while not await pr.store.check([SAVED_KEY]):
                    with contextlib.suppress(StoreError):  # a timeout: wait again
                        await pr.store.wait([SAVED_KEY], timeout=300)
                await self._listen(pr.bind)
                await self._announce(pr)
            except StoreError as exc:
                log.debug("the round's store is gone: %s", exc)

    async def _saved(self, pr: PeerRound) -> None:
        """This node's workers saved: listen, and say in the round's store that the job
        saves (once a round), so every agent listens."""
        if self._port is None:
            await self._listen(pr.bind)
            await self._announce(pr)
        if self._said_saved is not pr:
            await pr.store.set(SAVED_KEY, "1")
            self._said_saved = pr

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
        key = self._key
        if key is None or address.get("port") is None:
            raise ValueError(f"node {peer} does not listen (yet)")
        async with connect(address["host"], int(address["port"]), IO_TIMEOUT, key) as conn:
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
        try:
            await self._saved(pr)
        except StoreError as exc:  # the round is over: the next one copies
            log.debug("cannot say in the round's store that the job saves: %s", exc)
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
        if self._pending != (pr, step):
            count = min(self.copies, pr.group_world_size - 1)
            self._pending = (pr, step)
            self._left = {(pr.group_rank + i) % pr.group_world_size for i in range(1, count + 1)}
        left = self._left

        async def push_to(target: int) -> None:
            if await self._push_to(pr, target, step, world, opened):
                left.discard(target)

        try:
            async with anyio.create_task_group() as tg:
                for target in sorted(left):
                    tg.start_soon(push_to, target)
        finally:
            opened.close()
        if not left:  # else: the peers not listening yet get it at the next pass
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
                    await _ready(conn)
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
    ) -> bool:
        """Copy ``step`` to node ``target``. Returns False when it is to be tried again
        (the peer does not listen yet, or holds no step of its own yet), True otherwise
        (copied, or failed: the peer gets the next step)."""
        try:
            address = await self._address(pr.store, target)
            if address.get("port") is None:
                if address.get("pending"):
                    log.debug("node %d does not listen yet: step %d later", target, step)
                    return False
                log.debug("node %d keeps no copies (--checkpoint-peer-copies 0)", target)
                return True
            async with self._connect(pr.store, target, address) as conn:
                header = {"op": "push", "step": step, "world": world, **opened.header(pr.ranks)}
                await conn.send_line(header)
                await _ready(conn)
                if not await _send_files(conn, opened):
                    # saved over twice while it was sent (a copy slower than two steps)
                    log.debug("checkpoint step %d changed while it was copied", step)
                    return True
                if (await conn.receive_line()) != "ok":
                    raise ValueError("the peer did not confirm the copy")
            log.debug("checkpoint step %d copied to node %d", step, target)
        except _Refused as exc:
            if exc.retry:
                log.debug("node %d takes step %d later: %s", target, step, exc)
                return False
            log.warning("node %d refused checkpoint step %d: %s", target, step, exc)
        except _PEER_ERRORS as exc:
            log.warning("cannot copy checkpoint step %d to node %d: %s", step, target, _why(exc))
        return True

    # -- serving the peers ----------------------------------------------------------------

    def _prune(self, ranks: Sequence[int]) -> None:
        """Keep the two newest steps of ``ranks``; unmap what goes (blocking)."""
        L.prune(self.memory_dir, ranks)
        self._landing.sweep()

    async def _serve(
        self, bind: str, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # Exactly the address the node announces; "" (the agent found no route to the
        # rendezvous to take its address from) means every interface, as torchrun's stores.
        listener = await anyio.create_tcp_listener(local_host=bind or None, local_port=0)
        async with listener:
            port = listener.listeners[0].extra(SocketAttribute.local_port)
            log.debug("serving checkpoint peer copies on %s:%d", bind or "*", port)
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
                sock, address = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            if self._serving >= MAX_CONNECTIONS:
                sock.close()
                self._refuse(str(address[0]), f"{MAX_CONNECTIONS} connections already open")
                continue
            self._serving += 1
            tg.start_soon(self._handle_any, PeerConn(sock, IO_TIMEOUT), str(address[0]))

    async def _handle_any(self, conn: PeerConn, host: str) -> None:
        """:meth:`_handle`; a bug in it costs its connection, never the listener."""
        try:
            await self._handle(conn, host)
        except Exception:
            log.exception("checkpoint listener: a connection from %s failed", host)
        finally:
            self._serving -= 1

    async def _handle(self, conn: PeerConn, host: str) -> None:
        """One peer's request, once it proved it holds the job's key (else the connection
        is closed, and said once per address). Never raises: a broken exchange only loses
        its copy."""
        with contextlib.closing(conn):
            key = self._key
            if key is None:  # not listening before a key: cannot happen
                return
            try:
                await server_handshake(conn, key)
                request = await conn.receive_line()
            except A.PeerAuthError as exc:
                self._refuse(host, str(exc))
                return
            except _PEER_ERRORS as exc:
                if isinstance(exc, anyio.EndOfStream) and not conn.line_bytes:
                    # connected and closed, nothing said (a port scan, a probe)
                    log.debug("checkpoint listener: ignored a connection from %s", host)
                else:
                    self._refuse(host, f"no handshake ({_why(exc)})")
                return
            op = request.get("op") if isinstance(request, dict) else None
            if op not in ("push", "fetch", "metadata"):
                asked = repr(op)[:40]
                log.warning("checkpoint listener: a peer at %s asked for %s: refused", host, asked)
                return
            try:
                if op == "push":
                    refusal = push_refusal(
                        request,
                        self._own,
                        *await anyio.to_thread.run_sync(
                            _own_and_others, self.memory_dir, self._own
                        ),
                        self.copies,
                    )
                    if refusal is not None:
                        await conn.send_line({"error": refusal[0], "retry": refusal[1]})
                        log.debug("checkpoint listener: refused a push: %s", refusal[0])
                        return
                    await conn.send_line("ready")
                    step, world = int(request["step"]), int(request["world"])
                    files = request["files"]
                    if await _receive_files(conn, self._landing, step, world, request) is None:
                        log.debug("the copy of checkpoint step %d changed while it was sent", step)
                        return
                    ranks = [int(rank) for rank, _ in files]
                    await anyio.to_thread.run_sync(self._prune, ranks)
                    await conn.send_line("ok")
                elif op == "fetch":
                    ranks = request["ranks"]
                    if not isinstance(ranks, list) or len(ranks) > MAX_PUSH_FILES:
                        raise ValueError("a fetch of too many ranks")
                    ranks = [_whole(r, 0, MAX_WORLD, "rank") for r in ranks]
                    step = _whole(request["step"], 0, MAX_STEP, "step")
                    world = _whole(request["world"], 1, MAX_WORLD, "world")
                    await self._send_step(conn, step, world, ranks)
                elif op == "metadata":
                    step = _whole(request["step"], 0, MAX_STEP, "step")
                    data = bytearray(_metadata_size(request["size"], required=True))
                    await conn.send_line("ready")
                    await conn.receive_into(memoryview(data))
                    if await anyio.to_thread.run_sync(
                        os.path.isdir, L.step_dir(self.memory_dir, step)
                    ):
                        await anyio.to_thread.run_sync(
                            self._landing.put_metadata, step, bytes(data)
                        )
                    await conn.send_line("ok")
            except A.PeerAuthError as exc:
                self._refuse(host, str(exc))
            except _PEER_ERRORS as exc:
                log.warning("a checkpoint exchange with a peer at %s failed: %s", host, _why(exc))

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


async def _ready(conn: PeerConn) -> None:
    """The receiver's answer to a header: ``"ready"``, else raises :class:`_Refused`."""
    answer = await conn.receive_line()
    if answer == "ready":
        return
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        raise _Refused(answer["error"][:500], bool(answer.get("retry")))
    raise ValueError("the peer did not answer the header")


@contextlib.asynccontextmanager
async def open_peer_copies(
    memory_dir: str,
    copies: int,
    push_interval: float = PUSH_INTERVAL,
    key: bytes | None = None,
) -> AsyncIterator[PeerCopies]:
    """Peer copies of the checkpoints in ``memory_dir`` to ``copies`` other nodes, looked
    for every ``push_interval`` seconds; connections authenticated with ``key`` (the
    ``--job-secret-file``'s; None: agreed in each round's store, :func:`agree_key`).

    The listener starts once the job saves (:meth:`PeerCopies.join`);
    copies run in the background until the block is left, which cancels them (a copy
    in progress is cut short; the peer drops the partial file) and closes the listener.
    """
    landing = Landing(memory_dir)
    try:
        async with background_tasks() as tg:
            peers = PeerCopies(memory_dir, copies, tg, landing, key)
            tg.start_soon(peers.push_every, push_interval)
            yield peers
    finally:
        with anyio.CancelScope(shield=True):  # bounded: unmaps
            await anyio.to_thread.run_sync(landing.close)
