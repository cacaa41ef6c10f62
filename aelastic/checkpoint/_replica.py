"""Peer copies of checkpoints (``--checkpoint-replicas N``): a lost node's ranks resume.

Each agent of a job with several nodes serves a TCP listener on an ephemeral port and
announces it in the round's store (``aelastic/checkpoint/peer/<group rank>``). In the
background it copies the newest step complete for its ranks to the agents of the next
``N`` group ranks (``g+1 .. g+N`` modulo the number of nodes), which keep the two newest
steps of those ranks in their own memory directory, in the same layout as their own
(so ``load(rank=...)`` reads them like any other file). When a round starts, before the
workers do, each agent asks the others for a step of its ranks newer than the one it
holds and downloads the newest offered: a node that replaces a lost one gets its ranks'
state from a replica, and the agreement on the resume step counts it like any other.

The wire format is a JSON header line, then the raw bytes of the files it lists::

    {"op": "push", "step": 40, "world": 2, "files": [[1, 1048576]]}\\n<bytes>  -> "ok\\n"
    {"op": "offer", "ranks": [1], "after": 30}\\n  -> {"steps": {"40": 2}}\\n
    {"op": "fetch", "ranks": [1], "step": 40}\\n   -> {"world": 2, "files": [[1, n]]}\\n<bytes>

Nothing here blocks the event loop: files are read and written in worker threads, one
chunk (1 MiB) at a time (what arrives is written with one ``writev``, not joined first);
every network read and write has a timeout. A peer
that is closed, dead or too slow only costs its copy: errors are logged, never raised.
A file appears by ``rename`` once all its bytes arrived, so a copy cut short leaves no
partial file behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from .._dataclass import dataclass
from .._tasks import background_tasks
from ..store import Store, StoreError
from . import _layout as L

__all__ = ("PeerRound", "Replicas", "announce_no_replicas", "open_replicas")

log = logging.getLogger("aelastic.checkpoint")

KEY = "aelastic/checkpoint/peer"
#: Bytes read from a file, or sent, at a time (1 MiB: larger chunks measured longer
#: event-loop stalls, not more throughput).
CHUNK = 1 << 20
#: Longest wait for one header or chunk from a peer, and for a peer's address.
IO_TIMEOUT = 10.0
#: How often the agent looks for a newer step of its ranks to copy.
PUSH_INTERVAL = 0.5
_HEADER_MAX = 1 << 20
#: Pieces gathered for one writev (below the system's IOV_MAX of 1024).
_MAX_PARTS = 512
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC

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


def _newest(memory_dir: str, ranks: Iterable[int], after: int | None = None) -> dict[int, int]:
    """``{step: world}`` complete for ``ranks`` in ``memory_dir``, newer than ``after``."""
    steps = L.complete_steps(L.scan(memory_dir), ranks)
    return {s: w for s, w in steps.items() if after is None or s > after}


def _open_files(memory_dir: str, step: int, world: int, ranks: Sequence[int]) -> list[int]:
    """Descriptors of the step's rank files (blocking; all or none). An open file's
    bytes stay readable if the step is deleted while they are sent."""
    fds: list[int] = []
    try:
        for rank in ranks:
            fds.append(os.open(L.rank_file(memory_dir, step, rank, world), os.O_RDONLY))
    except OSError:
        _close_all(fds)
        raise
    return fds


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)


async def _send_line(stream: anyio.abc.ByteStream, message: Any) -> None:
    with anyio.fail_after(IO_TIMEOUT):
        await stream.send(json.dumps(message).encode() + b"\n")


async def _receive_line(receiver: BufferedByteReceiveStream) -> Any:
    with anyio.fail_after(IO_TIMEOUT):
        return json.loads(await receiver.receive_until(b"\n", _HEADER_MAX))


async def _send_files(stream: anyio.abc.ByteStream, fds: Sequence[int]) -> None:
    """The whole content of each file, in order (``pread`` in a worker thread: several
    copies may read the same descriptors at once)."""
    for fd in fds:
        offset = 0
        while chunk := await anyio.to_thread.run_sync(os.pread, fd, CHUNK, offset):
            offset += len(chunk)
            with anyio.fail_after(IO_TIMEOUT):
                await stream.send(chunk)


def _sizes(fds: Sequence[int], ranks: Sequence[int]) -> list[list[int]]:
    return [[rank, os.fstat(fd).st_size] for rank, fd in zip(ranks, fds, strict=True)]


async def _receive_files(
    receiver: BufferedByteReceiveStream, memory_dir: str, step: int, world: int, files: Any
) -> int:
    """Write the announced files into ``memory_dir`` (temp file, then rename: a file with
    the final name is whole; an existing one is replaced). Returns the bytes written."""
    total = 0
    for rank, size in files:
        rank, size = int(rank), int(size)
        final = L.rank_file(memory_dir, step, rank, world)
        tmp = os.path.join(memory_dir, f".replica_{rank}_{os.urandom(8).hex()}.tmp")
        fd = await anyio.to_thread.run_sync(os.open, tmp, _CREATE, 0o600)
        try:
            left = size
            while left:
                # a chunk's pieces as they arrive, written with one writev: no joining copy
                parts: list[bytes] = []
                count = 0
                while count < min(CHUNK, left) and len(parts) < _MAX_PARTS:
                    with anyio.fail_after(IO_TIMEOUT):
                        data = await receiver.receive(min(CHUNK, left) - count)
                    parts.append(data)
                    count += len(data)
                if await anyio.to_thread.run_sync(os.writev, fd, parts) != count:
                    raise OSError(f"short write to {tmp}")
                left -= count
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        await anyio.to_thread.run_sync(_commit, tmp, final)
        total += size
    return total


def _commit(tmp: str, final: str) -> None:
    os.makedirs(os.path.dirname(final), exist_ok=True)
    os.rename(tmp, final)


class Replicas:
    """This node's side of the peer copies: see :func:`open_replicas`."""

    def __init__(self, memory_dir: str, copies: int, tg: anyio.abc.TaskGroup) -> None:
        self.memory_dir = memory_dir
        self.copies = copies
        self._tg = tg
        self._round: PeerRound | None = None
        self._port: int | None = None
        #: the newest step copied to the current round's peers
        self._pushed: tuple[PeerRound, int] | None = None
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

    async def join(self, peer_round: PeerRound) -> int | None:
        """Announce this node's listener in the round's store and download, from the peer
        offering the newest, the steps of this node's ranks newer than any held here.

        Returns the newest step downloaded (None: none). Copies to peers pause until
        :meth:`started`. Raises only :class:`~aelastic.store.StoreError` (the round's
        store is gone); a peer that does not answer is skipped. Cancellation: stops (a
        file being received is removed).
        """
        self._round = None
        self._own = frozenset(peer_round.ranks)
        if self._port is None:
            self._port = await self._tg.start(self._serve, peer_round.bind)
        pr = peer_round
        held = await anyio.to_thread.run_sync(_newest, self.memory_dir, pr.ranks)
        after = max(held, default=None)
        # "holds": whether a peer may have anything to offer. A job that never saves
        # costs each agent one set and one get per peer per round, no connection.
        holds = bool(await anyio.to_thread.run_sync(L.scan, self.memory_dir))
        announced = {"host": pr.advertised, "port": self._port, "holds": holds}
        await pr.store.set(f"{KEY}/{pr.group_rank}", json.dumps(announced))
        peers = [g for g in range(pr.group_world_size) if g != pr.group_rank]
        offers: dict[int, dict[int, int]] = {}  # {group rank: {step: world}}

        async def ask(peer: int) -> None:
            try:
                address = await self._address(pr.store, peer)
                if not address.get("holds"):
                    return
                request = {"op": "offer", "ranks": list(pr.ranks), "after": after}
                async with await self._connect(pr.store, peer, address) as stream:
                    await _send_line(stream, request)
                    steps = (await _receive_line(BufferedByteReceiveStream(stream)))["steps"]
            except _PEER_ERRORS as exc:
                why = _why(exc)
                log.warning("node %d did not say which checkpoint steps it holds: %s", peer, why)
                return
            if steps:
                offers[peer] = {int(s): int(w) for s, w in steps.items()}

        async with anyio.create_task_group() as tg:
            for peer in peers:
                tg.start_soon(ask, peer)
        # From the peer offering the newest step, every step it offers (it keeps two): the
        # agreement may settle on the older one if another node lacks the newer.
        for peer, steps in sorted(offers.items(), key=lambda o: -max(o[1])):
            fetched = []
            for step, world in sorted(steps.items(), reverse=True):
                try:
                    size = await self._fetch(pr, peer, step, world)
                except _PEER_ERRORS as exc:
                    why = _why(exc)
                    log.warning("cannot fetch checkpoint step %d from node %d: %s", step, peer, why)
                    continue
                log.info(
                    "checkpoint step %d of ranks %s fetched from node %d (%d bytes)",
                    step, list(pr.ranks), peer, size,
                )  # fmt: skip
                fetched.append(step)
            if fetched:
                self.fetched_step = max(fetched)
                return self.fetched_step
        return None

    def started(self, peer_round: PeerRound) -> None:
        """The round's workers start: copy their steps to the peers from now on."""
        self._round = peer_round

    async def _address(self, store: Store, peer: int) -> dict[str, Any]:
        """What ``peer`` announced in the round's store (waits up to ``IO_TIMEOUT``)."""
        address = json.loads(await store.get(f"{KEY}/{peer}", timeout=IO_TIMEOUT))
        if not isinstance(address, dict):
            raise ValueError(f"not an address: {address!r}")
        return address

    async def _connect(
        self, store: Store, peer: int, address: dict[str, Any] | None = None
    ) -> anyio.abc.SocketStream:
        if address is None:
            address = await self._address(store, peer)
        with anyio.fail_after(IO_TIMEOUT):
            return await anyio.connect_tcp(address["host"], int(address["port"]))

    async def _fetch(self, pr: PeerRound, peer: int, step: int, world: int) -> int:
        async with await self._connect(pr.store, peer) as stream:
            await _send_line(stream, {"op": "fetch", "ranks": list(pr.ranks), "step": step})
            receiver = BufferedByteReceiveStream(stream)
            header = await _receive_line(receiver)
            if len(header["files"]) != len(pr.ranks):
                raise ValueError(f"the peer no longer holds step {step}")
            return await _receive_files(receiver, self.memory_dir, step, world, header["files"])

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
        if step is None or self._pushed == (pr, step):
            return
        world = complete[step]
        try:
            fds = await anyio.to_thread.run_sync(
                _open_files, self.memory_dir, step, world, pr.ranks
            )
        except OSError:  # dropped or replaced while we looked: the next pass sees why
            return
        count = min(self.copies, pr.group_world_size - 1)
        targets = [(pr.group_rank + i) % pr.group_world_size for i in range(1, count + 1)]
        try:
            async with anyio.create_task_group() as tg:
                for target in targets:
                    tg.start_soon(self._push_to, pr, target, step, world, fds)
        finally:
            _close_all(fds)
        self._pushed = (pr, step)
        self.pushed_step = step

    async def _push_to(
        self, pr: PeerRound, target: int, step: int, world: int, fds: Sequence[int]
    ) -> None:
        try:
            address = await self._address(pr.store, target)
            if address.get("port") is None:
                log.debug("node %d keeps no copies (--checkpoint-replicas 0)", target)
                return
            async with await self._connect(pr.store, target, address) as stream:
                header = {
                    "op": "push",
                    "step": step,
                    "world": world,
                    "files": _sizes(fds, pr.ranks),
                }
                await _send_line(stream, header)
                await _send_files(stream, fds)
                if (await _receive_line(BufferedByteReceiveStream(stream))) != "ok":
                    raise ValueError("the peer did not confirm the copy")
            log.debug("checkpoint step %d copied to node %d", step, target)
        except _PEER_ERRORS as exc:
            log.warning("cannot copy checkpoint step %d to node %d: %s", step, target, _why(exc))

    # -- serving the peers ----------------------------------------------------------------

    async def _serve(
        self, bind: str, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host=bind or None, local_port=0)
        async with listener:
            port = listener.listeners[0].extra(SocketAttribute.local_port)
            log.debug("serving checkpoint replicas on %s:%d", bind or "*", port)
            task_status.started(port)
            await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        """One peer's request. Never raises: a broken exchange only loses its copy."""
        async with stream:
            receiver = BufferedByteReceiveStream(stream)
            # A stray connection (a port scan, a probe) is no peer: a debug line, no more.
            try:
                request = await _receive_line(receiver)
            except _PEER_ERRORS as exc:
                log.debug("checkpoint listener: ignored a connection (%s)", _why(exc))
                return
            op = request.get("op") if isinstance(request, dict) else None
            if op not in ("push", "offer", "fetch"):
                log.debug("checkpoint listener: ignored a connection that is not a peer's")
                return
            try:
                if op == "push":
                    step, world = int(request["step"]), int(request["world"])
                    files = request["files"]
                    if self._own.intersection(int(rank) for rank, _ in files):
                        raise ValueError("a copy of this node's own ranks (an older round's)")
                    await _receive_files(receiver, self.memory_dir, step, world, files)
                    ranks = [int(rank) for rank, _ in files]
                    await anyio.to_thread.run_sync(L.prune, self.memory_dir, ranks)
                    await _send_line(stream, "ok")
                elif op == "offer":
                    held = await anyio.to_thread.run_sync(
                        _newest, self.memory_dir, request["ranks"], request["after"]
                    )
                    await _send_line(stream, {"steps": {str(s): w for s, w in held.items()}})
                elif op == "fetch":
                    await self._send_step(stream, int(request["step"]), request["ranks"])
            except _PEER_ERRORS as exc:
                log.warning("a checkpoint exchange with a peer failed: %s", _why(exc))

    async def _send_step(self, stream: anyio.abc.ByteStream, step: int, ranks: list[int]) -> None:
        held = await anyio.to_thread.run_sync(_newest, self.memory_dir, ranks, step - 1)
        if step not in held:
            await _send_line(stream, {"files": []})
            return
        fds = await anyio.to_thread.run_sync(_open_files, self.memory_dir, step, held[step], ranks)
        try:
            await _send_line(stream, {"world": held[step], "files": _sizes(fds, ranks)})
            await _send_files(stream, fds)
        finally:
            _close_all(fds)


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
    async with background_tasks() as tg:
        replicas = Replicas(memory_dir, copies, tg)
        tg.start_soon(replicas.push_every, push_interval)
        yield replicas
