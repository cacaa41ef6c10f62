"""One peer-copy connection: a non-blocking TCP socket, driven by anyio's socket waits.

What goes over it is JSON lines and the raw bytes of rank files. The bytes take the
shortest path the kernel offers, on every anyio backend and with no worker thread:

* **sent** with ``sendfile`` from the file's page cache to the socket (no read into
  Python, no copy in user space);
* **received** with ``recv_into`` straight into a mapping of the destination file (one
  copy, the kernel's, into pages allocated beforehand).

``sendfile`` may hand the socket references to the file's pages rather than copies, so
bytes still in flight can change if the file is written after the call returned: the
receiver acknowledges that it holds every byte before the sender checks whether its
files were taken over meanwhile (``_peer_copies``).

A run of calls that find the socket ready gives the event loop a turn every
:data:`TURN` seconds: a fast peer in another process kept one receive going for 19-44 ms
per 512 MiB here, the loop waiting.

Every connection starts with the job key's handshake (:func:`server_handshake`,
:func:`client_handshake`; see ``_peerauth``), after which each JSON line carries a MAC.

Every wait for the socket is bounded by ``io_timeout`` seconds (:class:`TimeoutError`);
a closed peer is :class:`anyio.EndOfStream`; a failed handshake or a line with a wrong
MAC is :class:`~._peerauth.PeerAuthError`; other failures are :class:`OSError`.
Cancellation leaves the connection unusable: the owner closes it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel

from .._net import connect_socket
from . import _peerauth as A

__all__ = ("PeerConn", "client_handshake", "connect", "server_handshake")

#: The longest line of a handshake (a nonce and a proof: well under it).
HANDSHAKE_LINE = 512

#: Bytes asked of ``sendfile`` at a time, and the most one ``recv_into`` takes: bounds
#: on one call's time on the event loop (the kernel copies, or faults in page tables).
SEND_CHUNK = 4 << 20
RECV_CHUNK = 1 << 20
_RECV_SIZE = 1 << 16
_RETRY = (BlockingIOError, InterruptedError)
#: Longest a run of send or receive calls keeps the event loop before it gives a turn.
TURN = 0.002


class _Turns:
    """When a run of socket calls gives the event loop a turn (every :data:`TURN` s)."""

    def __init__(self) -> None:
        self.due = time.monotonic() + TURN

    def waited(self) -> None:
        """The socket was waited for (the loop had its turn)."""
        self.due = time.monotonic() + TURN

    async def maybe(self) -> None:
        if time.monotonic() >= self.due:
            await anyio.lowlevel.checkpoint()
            self.due = time.monotonic() + TURN


class PeerConn:
    """A connected socket (made non-blocking here); see the module docstring."""

    def __init__(self, sock: socket.socket, io_timeout: float, max_line: int = 1 << 20) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.io_timeout = io_timeout
        self.max_line = max_line
        self._buffer = bytearray()  # received past the last line
        self._mac: A.LineMac | None = None  # set by the handshake
        #: bytes received as lines so far (0: the peer sent nothing: a probe)
        self.line_bytes = 0

    def secure(self, mac: A.LineMac) -> None:
        """From now on every line is sent with, and received only with, its MAC."""
        self._mac = mac

    async def _writable(self) -> None:
        with anyio.fail_after(self.io_timeout):
            await anyio.wait_writable(self.sock)

    async def _readable(self) -> None:
        with anyio.fail_after(self.io_timeout):
            await anyio.wait_readable(self.sock)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        turns = _Turns()
        while view:
            try:
                view = view[self.sock.send(view) :]
            except _RETRY:
                await self._writable()
                turns.waited()
                continue
            await turns.maybe()

    async def send_line(self, message: Any) -> None:
        body = json.dumps(message).encode()
        await self.send((body if self._mac is None else self._mac.seal(body)) + b"\n")

    async def send_file(self, fd: int, size: int) -> None:
        """The first ``size`` bytes of the file ``fd``. Raises OSError if it is shorter."""
        offset = 0
        turns = _Turns()
        while offset < size:
            try:
                sent = os.sendfile(self.sock.fileno(), fd, offset, min(SEND_CHUNK, size - offset))
            except _RETRY:
                await self._writable()
                turns.waited()
                continue
            if sent == 0:
                raise OSError(f"the file ended at byte {offset} of the {size} announced")
            offset += sent
            await turns.maybe()

    async def receive_line(self) -> Any:
        """The next JSON line. Raises ValueError (not JSON, or longer than ``max_line``),
        :class:`~._peerauth.PeerAuthError` (after the handshake: a wrong MAC)."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > self.max_line:
                raise ValueError(f"a line longer than {self.max_line} bytes")
            self._buffer += await self._receive()
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return json.loads(line if self._mac is None else self._mac.open(line))

    async def receive_into(self, view: memoryview) -> None:
        """Fill ``view`` (what was read past the last line first)."""
        taken = min(len(self._buffer), len(view))
        view[:taken] = self._buffer[:taken]
        del self._buffer[:taken]
        offset = taken
        turns = _Turns()
        while offset < len(view):
            try:
                got = self.sock.recv_into(view[offset : offset + RECV_CHUNK])
            except _RETRY:
                await self._readable()
                turns.waited()
                continue
            if got == 0:
                raise anyio.EndOfStream
            offset += got
            await turns.maybe()

    async def _receive(self) -> bytes:
        while True:
            try:
                data = self.sock.recv(_RECV_SIZE)
            except _RETRY:
                await self._readable()
                continue
            if not data:
                raise anyio.EndOfStream
            self.line_bytes += len(data)
            return data

    def close(self) -> None:
        """Close the socket (no wait: nothing else waits on it)."""
        self.sock.close()


async def server_handshake(conn: PeerConn, key: bytes) -> None:
    """The listener's side of the handshake (``_peerauth``), all of it within the
    connection's ``io_timeout``. Raises PeerAuthError (no handshake, a wrong key),
    TimeoutError, ValueError, anyio.EndOfStream, OSError."""
    server_nonce = os.urandom(A.NONCE_BYTES)
    limit, conn.max_line = conn.max_line, HANDSHAKE_LINE
    with anyio.fail_after(conn.io_timeout):
        await conn.send_line({"aelastic": A.PROTOCOL, "nonce": server_nonce.hex()})
        try:
            answer = await conn.receive_line()
        except ValueError:  # not JSON, too long: not a peer
            raise A.PeerAuthError("no handshake") from None
        if not isinstance(answer, dict):
            raise A.PeerAuthError("no handshake")
        client_nonce = A.nonce(answer.get("nonce"))
        expected = A.client_proof(key, server_nonce, client_nonce)
        A.check_proof(expected, answer.get("proof"), "the client")
        await conn.send_line({"proof": A.server_proof(key, server_nonce, client_nonce).hex()})
    conn.max_line = limit
    conn.secure(A.LineMac(A.session_key(key, server_nonce, client_nonce), client=False))


async def client_handshake(conn: PeerConn, key: bytes) -> None:
    """The connecting side of the handshake: proves it holds ``key`` and checks that the
    listener does too. Raises PeerAuthError, TimeoutError, ValueError, EndOfStream,
    OSError."""
    limit, conn.max_line = conn.max_line, HANDSHAKE_LINE
    with anyio.fail_after(conn.io_timeout):
        hello = await conn.receive_line()
        if not isinstance(hello, dict) or hello.get("aelastic") != A.PROTOCOL:
            raise A.PeerAuthError("the peer is no aelastic checkpoint listener")
        server_nonce = A.nonce(hello.get("nonce"))
        client_nonce = os.urandom(A.NONCE_BYTES)
        proof = A.client_proof(key, server_nonce, client_nonce)
        await conn.send_line({"nonce": client_nonce.hex(), "proof": proof.hex()})
        answer = await conn.receive_line()
        expected = A.server_proof(key, server_nonce, client_nonce)
        proven = answer.get("proof") if isinstance(answer, dict) else None
        A.check_proof(expected, proven, "the peer")
    conn.max_line = limit
    conn.secure(A.LineMac(A.session_key(key, server_nonce, client_nonce), client=True))


@asynccontextmanager
async def connect(host: str, port: int, io_timeout: float, key: bytes) -> AsyncIterator[PeerConn]:
    """A connection to ``host:port`` made within ``io_timeout`` seconds (also each later
    wait's bound), authenticated with the job's ``key``, closed on leaving. Raises
    OSError, TimeoutError, or what :func:`client_handshake` raises."""
    with anyio.fail_after(io_timeout):
        sock = await connect_socket(host, port)
    conn = PeerConn(sock, io_timeout)
    try:
        await client_handshake(conn, key)
        yield conn
    finally:
        conn.close()
