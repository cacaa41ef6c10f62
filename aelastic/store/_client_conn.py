"""One client connection to a TCPStore server, shared by many tasks, on any anyio backend.

Requests are *pipelined*: a task queues its request bytes and the replies it
expects, then awaits its :class:`_Slot`. Replies come back in request order, so
they are matched to slots in order.

* **Writing.** The first request on an idle connection is sent at once (no added
  latency for one task issuing one call at a time). While earlier requests are
  in flight, a request is queued and one task flushes the queue after a
  checkpoint (on asyncio, a loop callback does), so the requests of every task
  that runs in the same event-loop iteration leave in one ``send`` (64
  concurrent tasks share a few segments).
* **Reading** needs no background task. On asyncio (and uvloop) the socket is
  registered with the event loop once, for the connection's life
  (``loop.add_reader``): the loop's callback reads what arrived, parses it and
  fills the slots it completes (waking their tasks), with no task switch and no
  per-reply registration. A cancelled task leaves its slot in the queue; its
  reply is still consumed. Elsewhere (trio), whichever waiting task finds
  nobody reading takes the reader role, waits with :func:`anyio.wait_readable`,
  parses and fills the slots it completes, and when its own slot is done hands
  the role to the next waiting task; a cancelled task passes the role on.
* **Watchdog** (main connection): no byte for ``watch`` seconds while replies
  are pending fails the connection with :class:`~aelastic.store.StoreTimeoutError`
  (a stalled or partitioned server becomes an error, never a hang); on asyncio a
  loop timer checks it, elsewhere the reader's wait is bounded.

A task cancelled while a request of its own is only partly sent closes the
connection (the rest of the stream would be garbage to the server); every
pending call then fails with :class:`~aelastic.store.StoreConnectionError`. On
asyncio the rest is sent by a loop callback instead (``loop.add_writer``), so
the stream stays whole and the connection usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel
import sniffio

from .._net import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    USER_TIMEOUT_MS,
    connect_socket,
)
from . import _protocol as P
from ._exceptions import (
    ProtocolError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
)

__all__ = (
    "KEEPALIVE_COUNT",
    "KEEPALIVE_IDLE",
    "KEEPALIVE_INTERVAL",
    "USER_TIMEOUT_MS",
    "Replies",
    "_Conn",
    "connect_socket",
)

Replies = Sequence[tuple[P.Reply, int]]

#: Bytes asked of one ``recv``: a larger size costs a large allocation per call
#: (``recv(1 MiB)`` took ~80 us more than ``recv(64 KiB)`` for a 40-byte reply).
_RECV_SIZE = 64 * 1024
#: Bytes read per wake-up at most (``recv`` is repeated while it fills its buffer).
_RECV_LIMIT = 1 << 20


class _Slot:
    """The reply of one request: filled by whichever task reads."""

    __slots__ = ("done", "error", "event", "future", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: StoreError | None = None
        # set by the reader when done, or to hand over the reader role
        self.event: anyio.Event | None = None
        # asyncio: resolved by the loop's read callback when done
        self.future: asyncio.Future[None] | None = None


class _Conn:
    """One TCP connection: pipelined requests, replies matched in order (see module doc)."""

    def __init__(self, sock: socket.socket, endpoint: str) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.parser = P.ResponseParser()
        # one entry per expected reply: the request's slot on its last reply, None before
        self.slots: deque[_Slot | None] = deque()
        self._group: list[Any] = []
        self.error: StoreError | None = None
        self._wbuf: list[bytes] = []
        self._queued = 0  # entries of ``slots`` whose request is still in _wbuf
        self._flush_scheduled = False
        self._draining = False
        self._reading = False
        self._watch: float | None = None
        self._open = True
        #: the first bytes the server sent (at most 64): what answered, when it is not a store
        self.head = b""
        # asyncio: the loop whose callbacks read and write this socket (see the module)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # loop time of the last byte, or of the first pending request
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = ""
        if library == "asyncio":
            loop = asyncio.get_running_loop()
            loop.add_reader(sock.fileno(), self._on_readable)
            self._loop = loop

    def peer_closed(self) -> bool:
        """Whether the server ended this idle connection (EOF or reset waiting unread).

        An idle connection has nothing to read; anything there means it is unusable.
        One non-blocking ``recv`` with ``MSG_PEEK``: used before reusing a pooled
        connection, so a server that died or was replaced since (a re-hosted store on
        the same port) costs a fresh connection, not a failed call.
        """
        if self.error is not None:
            return True
        try:
            self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False  # nothing there: the connection is alive and idle
        except OSError:
            pass  # reset
        return True  # EOF, a reset or an unexpected byte

    def watch(self, timeout: float) -> None:
        """Fail the connection if the server leaves a request unanswered for ``timeout`` s.

        Used on the main connection, which never carries WAIT: a healthy server
        answers its requests at once.
        """
        self._watch = timeout

    # -- queueing requests --------------------------------------------------------------

    def request(self, data: bytes, replies: Replies) -> _Slot:
        """Queue ``data``; return the slot of its reply (a list for several replies).

        Await :meth:`result` for the value (which also sends the request).
        """
        if self.error is not None:
            raise self.error
        slots = self.slots
        loop = self._loop
        if loop is not None and self._watch is not None:
            if not slots:
                self._since = loop.time()
            if self._timer is None:
                self._timer = loop.call_at(self._since + self._watch, self._on_watch)
        self._wbuf.append(data)
        expect = self.parser.expect
        for kind, count in replies[:-1]:
            expect(kind, count)
            slots.append(None)
        kind, count = replies[-1]
        expect(kind, count)
        slot = _Slot()
        slots.append(slot)
        self._queued += len(replies)
        return slot

    def queue(self, data: bytes) -> None:
        """Queue a request that has no reply; it leaves with the next flush."""
        if self.error is not None:
            raise self.error
        self._wbuf.append(data)

    async def send(self, data: bytes) -> None:
        """Send a request that has no reply (SET, APPEND, ...)."""
        if self.error is not None:
            raise self.error
        self._wbuf.append(data)
        await self.flush()

    async def flush(self) -> None:
        """Hand the queued requests to the kernel (batched while others are in flight)."""
        if not self._wbuf or self._flush_scheduled:
            return
        loop = self._loop
        if loop is not None:
            if self._draining:
                return  # the writer callback sends what we queued too
            if len(self.slots) > self._queued:
                # earlier requests are in flight: send with the other tasks' of this
                # loop iteration, from a callback (no await: nothing to cancel)
                self._flush_scheduled = True
                loop.call_soon(self._flush_soon)
            else:
                self._flush_now()
            return
        if len(self.slots) > self._queued:
            # earlier requests are in flight: let the other tasks of this loop
            # iteration queue theirs, then send them all at once
            self._flush_scheduled = True
            try:
                await anyio.lowlevel.cancel_shielded_checkpoint()
            finally:
                self._flush_scheduled = False
            if not self._wbuf or self.error is not None:
                return
        if self._send_queued():
            await self._drain()

    async def _drain(self) -> None:
        """Send the rest of a partly sent buffer as the kernel takes it."""
        if self._draining:
            return  # the draining task sends what we queued too
        self._draining = True
        try:
            while self._wbuf and self.error is None:
                await anyio.wait_writable(self.sock)
                data = b"".join(self._wbuf)
                try:
                    n = self.sock.send(data)
                except (BlockingIOError, InterruptedError):
                    n = 0
                self._wbuf = [data[n:]] if n < len(data) else []
        except (OSError, anyio.ClosedResourceError) as exc:
            self._fail(StoreConnectionError(f"send failed: {exc}", endpoint=self.endpoint))
        except BaseException:
            # cancelled with a request partly sent: the stream is unusable
            self.close(
                StoreConnectionError(
                    "a request was cancelled while partly sent; connection closed",
                    endpoint=self.endpoint,
                )
            )
            raise
        finally:
            self._draining = False

    # -- awaiting replies ---------------------------------------------------------------

    async def result(self, slot: _Slot) -> Any:
        """Send what is queued, then wait for ``slot``'s reply; raise the connection's error."""
        await self.flush()
        loop = self._loop
        if loop is not None:
            if not slot.done:
                future = slot.future = loop.create_future()
                try:
                    await future
                finally:
                    slot.future = None
            if slot.error is not None:
                raise slot.error
            return slot.value
        while not slot.done:
            if self._reading:
                event = slot.event = anyio.Event()
                try:
                    await event.wait()
                except BaseException:
                    slot.event = None
                    if not self._reading:
                        self._hand_over()  # we may have been chosen as the next reader
                    raise
                slot.event = None
            else:
                await self._read()
        if slot.error is not None:
            raise slot.error
        return slot.value

    async def _read(self) -> None:
        """Take the reader role for one receive; hand it on afterwards."""
        self._reading = True
        try:
            if self._watch is None:
                await anyio.wait_readable(self.sock)
            else:
                with anyio.move_on_after(self._watch) as scope:
                    await anyio.wait_readable(self.sock)
                if scope.cancelled_caught:
                    self.close(
                        StoreTimeoutError(
                            f"no response from the store within {self._watch} s",
                            endpoint=self.endpoint,
                        )
                    )
                    return
            self._receive()
        except (OSError, anyio.ClosedResourceError) as exc:
            if self.error is None:
                self.close(StoreConnectionError(f"connection lost: {exc}", endpoint=self.endpoint))
        finally:
            self._reading = False
            self._hand_over()

    def _receive(self) -> None:
        """Read what the socket holds (up to :data:`_RECV_LIMIT`) and fill the slots.

        Raises :class:`OSError` (the caller closes); EOF closes the connection here.
        """
        data = b""
        try:
            chunk = self.sock.recv(_RECV_SIZE)
            data = chunk
            while len(chunk) == _RECV_SIZE and len(data) < _RECV_LIMIT:
                chunk = self.sock.recv(_RECV_SIZE)
                data += chunk
        except (BlockingIOError, InterruptedError):
            if not data:
                return
            chunk = b"-"  # not EOF: the kernel had no more yet
        if not self.head:
            self.head = data[:64]
        if data:
            self._dispatch(data)
        if not chunk and self.error is None:
            self.close(
                StoreConnectionError(
                    "connection lost (closed by the server)", endpoint=self.endpoint
                )
            )

    # -- asyncio: loop callbacks (see the module) ----------------------------------------

    def _on_readable(self) -> None:
        """The loop's read callback: receive, fill slots; a failure closes the connection."""
        if self._timer is not None:
            assert self._loop is not None
            self._since = self._loop.time()
        try:
            self._receive()
        except OSError as exc:
            if self.error is None:
                self.close(StoreConnectionError(f"connection lost: {exc}", endpoint=self.endpoint))

    def _on_watch(self) -> None:
        """The watchdog's timer: fail the connection if replies waited ``watch`` s in silence."""
        self._timer = None
        loop, watch = self._loop, self._watch
        if loop is None or watch is None or self.error is not None or not self.slots:
            return
        due = self._since + watch
        if loop.time() < due:
            self._timer = loop.call_at(due, self._on_watch)
            return
        self.close(
            StoreTimeoutError(
                f"no response from the store within {watch} s", endpoint=self.endpoint
            )
        )

    def _flush_soon(self) -> None:
        self._flush_scheduled = False
        if self.error is None and not self._draining:
            self._flush_now()

    def _send_queued(self) -> bool:
        """Send the queued requests in one ``send``; True when the kernel left some unsent
        (kept at the head of the queue). A send error fails the connection (False)."""
        data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
        self._wbuf = []
        self._queued = 0
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._fail(StoreConnectionError(f"send failed: {exc}", endpoint=self.endpoint))
            return False
        if n == len(data):
            return False
        self._wbuf.insert(0, data[n:])
        return True

    def _flush_now(self) -> None:
        """Send what is queued; what the kernel does not take goes with the write callback."""
        if self._wbuf and self._send_queued():
            assert self._loop is not None
            self._draining = True
            self._loop.add_writer(self.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        """The loop's write callback while a send is partial: send the rest, then stop."""
        if (self._wbuf and self._send_queued()) or self.error is not None:
            return  # still partial (called again when writable), or failed and closed
        self._draining = False
        assert self._loop is not None
        self._loop.remove_writer(self.sock.fileno())

    def _hand_over(self) -> None:
        """Wake the oldest task still waiting for a reply: it becomes the reader."""
        for slot in self.slots:
            if slot is not None and slot.event is not None and not slot.done:
                slot.event.set()
                return

    def _dispatch(self, data: bytes) -> None:
        try:
            values = self.parser.feed(data)
        except ProtocolError as exc:
            self.close(
                StoreConnectionError(
                    f"server sent a malformed response: {exc}", endpoint=self.endpoint
                )
            )
            return
        slots = self.slots
        group = self._group
        for v in values:
            slot = slots.popleft()
            if slot is None:  # not the last reply of a multi-reply request
                group.append(v)
                continue
            if group:
                group.append(v)
                v, group = group, []
                self._group = group
            slot.value = v
            slot.done = True
            if slot.event is not None:
                slot.event.set()
            future = slot.future
            if future is not None and not future.done():
                future.set_result(None)

    # -- closing ------------------------------------------------------------------------

    def _fail(self, error: StoreError) -> None:
        """Fail every pending and later request with ``error``; close the socket."""
        if self.error is None:
            self.error = error
        slots, self.slots = self.slots, deque()
        self._queued = 0
        self._wbuf = []
        for slot in slots:
            if slot is not None and not slot.done:
                slot.error = self.error
                slot.done = True
                if slot.event is not None:
                    slot.event.set()
                future = slot.future
                if future is not None and not future.done():
                    future.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._open:
            self._open = False
            loop = self._loop
            if loop is not None:
                fd = self.sock.fileno()
                # a closed loop (interpreter exit) has nothing registered any more
                if not loop.is_closed():
                    loop.remove_reader(fd)
                    loop.remove_writer(fd)
            else:
                with contextlib.suppress(RuntimeError):  # no event loop (interpreter exit)
                    anyio.notify_closing(self.sock)
            self.sock.close()

    def close(self, error: StoreError | None = None, *, graceful: bool = False) -> None:
        """Close the connection; pending and later requests raise ``error``.

        ``graceful`` first tries to hand the queued requests to the kernel (a
        ``set`` whose call already returned); otherwise they are dropped.
        """
        if graceful and self.error is None and self._wbuf:
            with contextlib.suppress(OSError):
                self.sock.send(b"".join(self._wbuf))
        self._fail(error or StoreClosedError("the client is closed", endpoint=self.endpoint))
