"""Sans-IO implementation of torch's TCPStore wire protocol (torch >= 2.4 numbering).

Nothing here touches a socket: :class:`RequestParser` turns the bytes a server
receives into request tuples, the ``encode_*`` functions build responses and
requests, and :class:`ResponseParser` turns the bytes a client receives into
values. Both parsers accept data in arbitrary pieces (a frame may be split
anywhere) and raise :class:`~aelastic.store._exceptions.ProtocolError` on bytes that cannot be
a valid frame: unknown opcode, a length above the configured limits, a first
message that is not ``VALIDATE`` with the right magic. After an error the parser
is unusable and the connection must be closed.

Wire format (little-endian): a request is ``u8 opcode`` then its arguments; strings
are ``u64 length`` + bytes; key lists are ``u64 count`` + strings. See
``tcpstore_protocol.md`` for the table of requests and responses.

Requests are plain tuples ``(opcode, *args)`` for speed (this is the server's hot
path); keys and values are ``bytes``:

=================  ==========================================
``VALIDATE``       ``(0, magic)``
``SET``            ``(1, key, value)``
``COMPARE_SET``    ``(2, key, expected, desired)``
``GET``            ``(3, key)``
``ADD``            ``(4, key, delta)``
``CHECK``          ``(5, keys)``  (``keys`` is a list)
``WAIT``           ``(6, keys)``
``GETNUMKEYS``     ``(7,)``
``DELETE_KEY``     ``(8, key)``
``APPEND``         ``(9, key, value)``
``MULTI_GET``      ``(10, keys)``
``MULTI_SET``      ``(11, keys, values)``
``CANCEL_WAIT``    ``(12,)``
``PING``           ``(13, nonce)``
``QUEUE_PUSH``     ``(14, key, value)``
``QUEUE_POP``      ``(15, key)``
``QUEUE_LEN``      ``(16, key)``
``LIST_KEYS``      ``(17,)``
``BARRIER``        ``(18, key, world_size)``
=================  ==========================================

aelastic's extension requests (opcodes ``0xA0``-``0xA3``, which torch clients never
send; torch's server closes the connection on them):

=======================  ==============================================  ============
``AE_HELLO``             ``(0xA0,)``                                     ``u32`` version
``AE_ON_CLOSE``          ``(0xA1, action, key, value)``: ``u8`` action   ``i64`` id
                         (a torch opcode: SET, ADD, DELETE_KEY, APPEND,
                         QUEUE_PUSH) + two strings; the server performs
                         it when this connection closes
``AE_ON_CLOSE_CANCEL``   ``(0xA2, id)``: ``i64`` (-1 = all)              ``i64`` count
``AE_GET_WAIT``          ``(0xA3, key)``: answered once ``key`` exists   ``bytes`` value
                         (WAIT then GET in one round trip; version 2)
=======================  ==============================================  ============
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

from ._exceptions import ProtocolError

__all__ = (
    "MAGIC",
    "Opcode",
    "Reply",
    "STOP_WAITING",
    "WAIT_CANCELED",
    "CHECK_READY",
    "CHECK_NOT_READY",
    "MAX_KEY_SIZE",
    "MAX_VALUE_SIZE",
    "MAX_KEY_COUNT",
    "AE_VERSION",
    "AE_GET_WAIT_VERSION",
    "AE_ON_CLOSE_ACTIONS",
    "Request",
    "RequestParser",
    "ResponseParser",
)

#: The magic number carried by ``VALIDATE``, the mandatory first request.
MAGIC = 0x3C85F7CE

#: ``WAIT``/``BARRIER`` answer: every key exists (or every participant arrived).
STOP_WAITING = 0
#: ``CANCEL_WAIT`` answer.
WAIT_CANCELED = 1
#: ``CHECK`` answers.
CHECK_READY = 0
CHECK_NOT_READY = 1

#: torch's libuv server limits, our defaults.
MAX_KEY_SIZE = 8 * 1024
MAX_VALUE_SIZE = 8 * 1024 * 1024
MAX_KEY_COUNT = 128 * 1024


class Opcode(enum.IntEnum):
    """Request opcodes of torch >= 2.4."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18
    # aelastic extensions (never sent by torch clients; torch's server drops the
    # connection on them, which is how a client learns they are unsupported)
    AE_HELLO = 0xA0
    AE_ON_CLOSE = 0xA1
    AE_ON_CLOSE_CANCEL = 0xA2
    AE_GET_WAIT = 0xA3


#: Version of the aelastic extensions a server answers ``AE_HELLO`` with.
AE_VERSION = 2
#: The first extensions version whose servers answer ``AE_GET_WAIT``.
AE_GET_WAIT_VERSION = 2
#: Store writes an ``AE_ON_CLOSE`` may register: SET, ADD, DELETE_KEY, APPEND, QUEUE_PUSH.
AE_ON_CLOSE_ACTIONS = frozenset({1, 4, 8, 9, 14})


#: A parsed request: ``(opcode, *args)``, see the module docstring.
Request = tuple[Any, ...]

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_VALIDATE_FRAME = b"\x00" + _U32.pack(MAGIC)
_U64_unpack_from = _U64.unpack_from

_OP_NAMES = {op.value: op.name for op in Opcode}


class _Incomplete(Exception):
    """Internal: the frame needs at least ``end`` bytes of the buffer.

    ``start`` is where the bytes to keep begin (the start of the frame, or of the
    incomplete item of a multi-key frame whose earlier items are already parsed).
    """

    __slots__ = ("end", "start")

    def __init__(self, end: int, start: int = -1) -> None:
        self.end = end
        self.start = start


class _MultiFrame:
    """The parsed part of a multi-key request (CHECK, WAIT, MULTI_GET, MULTI_SET)."""

    __slots__ = ("keys", "left", "op", "size", "values")

    def __init__(self, op: int, count: int, size: int) -> None:
        self.op = op
        self.left = count
        self.size = size
        self.keys: list[bytes] = []
        self.values: list[bytes] = []


# ---------------------------------------------------------------------------
# Server side: request parser and response encoders
# ---------------------------------------------------------------------------


class RequestParser:
    """Incremental, linear-time parser of the requests a TCPStore server receives.

    :meth:`feed` takes whatever bytes arrived and returns the complete requests
    they finish, keeping a partial trailing frame for the next call. Limits are
    enforced as soon as a length prefix is read, before its data arrives, so an
    oversized length never makes the parser buffer it.

    Every byte is parsed once: a frame with many keys (CHECK, WAIT, MULTI_GET,
    MULTI_SET) is parsed item by item as its bytes arrive, and only the one
    incomplete item is held back as raw bytes (at most a key and a value), so a
    100 MB MULTI_SET costs the same per byte as many small requests, and the work
    done by one :meth:`feed` is proportional to the data it is given.

    ``max_frame_size`` bounds one whole request (a multi-key frame counts every
    item; None, the default: only the key, value and key-count limits, as torch).
    ``require_validate`` (default) makes anything but ``VALIDATE`` with the right
    magic as the first request a :class:`ProtocolError`.
    """

    __slots__ = (
        "_buf",
        "_multi",
        "_need",
        "_validated",
        "max_frame_size",
        "max_key_count",
        "max_key_size",
        "max_value_size",
    )

    def __init__(
        self,
        *,
        max_key_size: int = MAX_KEY_SIZE,
        max_value_size: int = MAX_VALUE_SIZE,
        max_key_count: int = MAX_KEY_COUNT,
        max_frame_size: int | None = None,
        require_validate: bool = True,
    ) -> None:
        self.max_key_size = max_key_size
        self.max_value_size = max_value_size
        self.max_key_count = max_key_count
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._need = 0
        self._multi: _MultiFrame | None = None
        self._validated = not require_validate

    @property
    def validated(self) -> bool:
        """The first request (``VALIDATE`` with the right magic) has arrived."""
        return self._validated

    @property
    def ready(self) -> bool:
        """Validated and holding no partial request: the next byte starts a request."""
        return self._validated and not self._buf and self._multi is None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete request held (raw or parsed; non-zero at EOF = half-sent)."""
        multi = self._multi
        return len(self._buf) + (0 if multi is None else multi.size)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Request]:
        """Parse ``data`` (appended to any held-back bytes); return complete requests.

        Raises :class:`ProtocolError` on malformed input; the parser must then be
        discarded together with its connection.
        """
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return []
            buf: bytes = bytes(self._buf)
            self._buf = bytearray()
        else:
            buf = data if type(data) is bytes else bytes(data)
        out: list[Request] = []
        pos = 0
        end = len(buf)
        parse = self._parse_one
        try:
            if self._multi is not None:
                pos = self._items(buf, 0, end, out)
            while pos < end:
                pos = parse(buf, pos, end, out)
        except _Incomplete as inc:
            start = pos if inc.start < 0 else inc.start
            self._buf = bytearray(buf[start:])
            self._need = inc.end - start
        return out

    # -- helpers ---------------------------------------------------------

    @staticmethod
    def _string(buf: bytes, p: int, end: int, limit: int, what: str) -> tuple[bytes, int]:
        q = p + 8
        if q > end:
            raise _Incomplete(q)
        (n,) = _U64.unpack_from(buf, p)
        if n > limit:
            raise ProtocolError(f"{what} length {n} exceeds the limit of {limit} bytes")
        e = q + n
        if e > end:
            raise _Incomplete(e)
        return buf[q:e], e

    def _frame_limit(self, size: int) -> None:
        if self.max_frame_size is not None and size > self.max_frame_size:
            raise ProtocolError(
                f"request of at least {size} bytes exceeds the frame limit of "
                f"{self.max_frame_size} bytes (max_frame_size)"
            )

    def _begin_multi(self, buf: bytes, op: int, p: int, end: int, out: list[Request]) -> int:
        q = p + 8
        if q > end:
            raise _Incomplete(q)
        (n,) = (_I64 if op == 11 else _U64).unpack_from(buf, p)
        if n < 0 or n > self.max_key_count:
            raise ProtocolError(
                f"key count {n} is outside the limit of 0..{self.max_key_count} keys per request"
            )
        self._multi = _MultiFrame(op, n, 9)
        return self._items(buf, q, end, out)

    def _items(self, buf: bytes, p: int, end: int, out: list[Request]) -> int:
        """Parse the next items of the current multi-key frame from ``p``."""
        m = self._multi
        assert m is not None
        string = self._string
        mk = self.max_key_size
        mv = self.max_value_size
        keys = m.keys
        values = m.values
        with_values = m.op == 11
        left = m.left
        size = m.size
        try:
            while left:
                key, q = string(buf, p, end, mk, "key")
                if with_values:
                    value, q = string(buf, q, end, mv, "value")
                    values.append(value)
                keys.append(key)
                size += q - p
                left -= 1
                p = q
        except _Incomplete as inc:
            m.left = left
            m.size = size
            self._frame_limit(size + inc.end - p)
            inc.start = p
            raise
        self._frame_limit(size)
        self._multi = None
        out.append((m.op, keys, values) if with_values else (m.op, keys))
        return p

    def _parse_one(self, buf: bytes, pos: int, end: int, out: list[Request]) -> int:
        op = buf[pos]
        p = pos + 1
        string = self._string
        mk = self.max_key_size
        mv = self.max_value_size
        if not self._validated:
            if op != 0:
                raise ProtocolError(
                    f"first request must be VALIDATE (opcode 0), got opcode {op}: "
                    "not a TCPStore client (torch >= 2.4)"
                )
            q = p + 4
            if q > end:
                raise _Incomplete(q)
            (magic,) = _U32.unpack_from(buf, p)
            if magic != MAGIC:
                raise ProtocolError(f"VALIDATE carries magic {magic:#x}, expected {MAGIC:#x}")
            self._validated = True
            out.append((0, magic))
            return q
        # The hottest requests (SET, GET, single-key WAIT: torch's set/get) are
        # parsed inline; the rest go through the _string/_begin_multi helpers.
        if op == 1 or op == 3:  # SET, GET
            q = p + 8
            if q > end:
                raise _Incomplete(q)
            n: int = _U64_unpack_from(buf, p)[0]
            if n > mk:
                raise ProtocolError(f"key length {n} exceeds the limit of {mk} bytes")
            e = q + n
            if e > end:
                raise _Incomplete(e)
            key = buf[q:e]
            if op == 3:
                out.append((3, key))
                return e
            q = e + 8
            if q > end:
                raise _Incomplete(q)
            n = _U64_unpack_from(buf, e)[0]
            if n > mv:
                raise ProtocolError(f"value length {n} exceeds the limit of {mv} bytes")
            e = q + n
            if e > end:
                raise _Incomplete(e)
            out.append((1, key, buf[q:e]))
            return e
        if op == 9 or op == 14:  # APPEND, QUEUE_PUSH
            key, p = string(buf, p, end, mk, "key")
            value, p = string(buf, p, end, mv, "value")
            out.append((op, key, value))
            return p
        if op == 8 or op == 15 or op == 16 or op == 0xA3:  # DELETE_KEY, QUEUE_POP/LEN, AE_GET_WAIT
            key, p = string(buf, p, end, mk, "key")
            out.append((op, key))
            return p
        if op == 6 or op == 5 or op == 10 or op == 11:  # WAIT, CHECK, MULTI_GET, MULTI_SET
            return self._begin_multi(buf, op, p, end, out)
        if op == 4 or op == 18:  # ADD, BARRIER
            key, p = string(buf, p, end, mk, "key")
            q = p + 8
            if q > end:
                raise _Incomplete(q)
            (num,) = _I64.unpack_from(buf, p)
            if op == 18 and num <= 0:
                raise ProtocolError(f"BARRIER world size must be positive, got {num}")
            out.append((op, key, num))
            return q
        if op == 2:  # COMPARE_SET
            key, p = string(buf, p, end, mk, "key")
            expected, p = string(buf, p, end, mv, "value")
            desired, p = string(buf, p, end, mv, "value")
            out.append((op, key, expected, desired))
            return p
        if op == 7 or op == 12 or op == 17:  # GETNUMKEYS, CANCEL_WAIT, LIST_KEYS
            out.append((op,))
            return p
        if op == 13:  # PING
            q = p + 4
            if q > end:
                raise _Incomplete(q)
            (nonce,) = _U32.unpack_from(buf, p)
            out.append((op, nonce))
            return q
        if op == 0xA1:  # AE_ON_CLOSE
            q = p + 1
            if q > end:
                raise _Incomplete(q)
            action = buf[p]
            if action not in AE_ON_CLOSE_ACTIONS:
                raise ProtocolError(f"AE_ON_CLOSE action {action} is not a recordable write")
            key, q = string(buf, q, end, mk, "key")
            value, q = string(buf, q, end, mv, "value")
            if action == 4:
                try:
                    int(value)
                except ValueError:
                    raise ProtocolError(
                        f"AE_ON_CLOSE ADD delta {value[:32]!r} is not a decimal integer"
                    ) from None
            out.append((op, action, key, value))
            return q
        if op == 0xA0:  # AE_HELLO
            out.append((op,))
            return p
        if op == 0xA2:  # AE_ON_CLOSE_CANCEL
            q = p + 8
            if q > end:
                raise _Incomplete(q)
            out.append((op, _I64.unpack_from(buf, p)[0]))
            return q
        if op == 0:
            raise ProtocolError("VALIDATE sent twice on one connection")
        raise ProtocolError(f"unknown opcode {op} (torch >= 2.4 uses 0-18)")


def encode_bytes(value: bytes) -> bytes:
    """Response of GET and COMPARE_SET (one of MULTI_GET): ``u64 len`` + bytes."""
    return _U64.pack(len(value)) + value


def encode_i64(value: int) -> bytes:
    """Response of ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN."""
    return _I64.pack(value)


def encode_u8(value: int) -> bytes:
    """Response of CHECK, WAIT, BARRIER, CANCEL_WAIT."""
    return _U8.pack(value)


def encode_bytes_list(values: Sequence[bytes]) -> bytes:
    """Response of MULTI_GET: each value as ``u64 len`` + bytes, no count."""
    pack = _U64.pack
    return b"".join([pack(len(v)) + v for v in values])


def encode_string_list(values: Sequence[bytes]) -> bytes:
    """Response of LIST_KEYS: ``i64 count`` then each string."""
    return _I64.pack(len(values)) + encode_bytes_list(values)


def encode_queue_pop(value: bytes | None) -> bytes:
    """Response of QUEUE_POP: ``i64 0`` when empty, else ``i64 1`` + the value."""
    if value is None:
        return _I64.pack(0)
    return _I64.pack(1) + _U64.pack(len(value)) + value


# ---------------------------------------------------------------------------
# Client side: request encoders and response parser
# ---------------------------------------------------------------------------


def _s(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _klist(keys: Sequence[bytes]) -> bytes:
    pack = _U64.pack
    return pack(len(keys)) + b"".join([pack(len(k)) + k for k in keys])


def request_validate() -> bytes:
    return _VALIDATE_FRAME


def request_ping(nonce: int) -> bytes:
    return b"\x0d" + _U32.pack(nonce & 0xFFFFFFFF)


def request_set(key: bytes, value: bytes) -> bytes:
    return b"\x01" + _U64.pack(len(key)) + key + _U64.pack(len(value)) + value


def request_compare_set(key: bytes, expected: bytes, desired: bytes) -> bytes:
    return b"\x02" + _s(key) + _s(expected) + _s(desired)


def request_get(key: bytes) -> bytes:
    return b"\x03" + _U64.pack(len(key)) + key


def request_add(key: bytes, delta: int) -> bytes:
    return b"\x04" + _U64.pack(len(key)) + key + _I64.pack(delta)


def request_check(keys: Sequence[bytes]) -> bytes:
    return b"\x05" + _klist(keys)


def request_wait(keys: Sequence[bytes]) -> bytes:
    return b"\x06" + _klist(keys)


def request_num_keys() -> bytes:
    return b"\x07"


def request_delete_key(key: bytes) -> bytes:
    return b"\x08" + _s(key)


def request_append(key: bytes, value: bytes) -> bytes:
    return b"\x09" + _s(key) + _s(value)


def request_multi_get(keys: Sequence[bytes]) -> bytes:
    return b"\x0a" + _klist(keys)


def request_multi_set(keys: Sequence[bytes], values: Sequence[bytes]) -> bytes:
    parts = [b"\x0b", _I64.pack(len(keys))]
    for k, v in zip(keys, values, strict=True):
        parts.append(_s(k))
        parts.append(_s(v))
    return b"".join(parts)


def request_cancel_wait() -> bytes:
    return b"\x0c"


def request_queue_push(key: bytes, value: bytes) -> bytes:
    return b"\x0e" + _s(key) + _s(value)


def request_queue_pop(key: bytes) -> bytes:
    return b"\x0f" + _s(key)


def request_queue_len(key: bytes) -> bytes:
    return b"\x10" + _s(key)


def request_list_keys() -> bytes:
    return b"\x11"


def request_barrier(key: bytes, world_size: int) -> bytes:
    return b"\x12" + _s(key) + _I64.pack(world_size)


def request_ae_hello() -> bytes:
    return b"\xa0"


def request_on_close(action: int, key: bytes, value: bytes) -> bytes:
    return b"\xa1" + _U8.pack(action) + _s(key) + _s(value)


def request_on_close_cancel(action_id: int) -> bytes:
    return b"\xa2" + _I64.pack(action_id)


def request_get_wait(key: bytes) -> bytes:
    return b"\xa3" + _U64.pack(len(key)) + key


class Reply(enum.IntEnum):
    """Shapes of responses a client can expect (see :class:`ResponseParser`)."""

    BYTES = 0  # u64 len + bytes -> bytes
    I64 = 1  # -> int
    U8 = 2  # -> int
    U32 = 3  # -> int
    BYTES_LIST = 4  # n x (u64 len + bytes), n given by the caller -> list[bytes]
    STRING_LIST = 5  # i64 n + n strings -> list[bytes]
    QUEUE_POP = 6  # i64 flag [+ bytes] -> bytes | None


class ResponseParser:
    """Incremental parser of the responses a TCPStore client receives.

    The protocol is not self-describing, so the caller announces each response it
    expects, in request order, with :meth:`expect`; :meth:`feed` then returns the
    values of the responses the data completes, in the same order. Responses larger
    than ``max_value_size`` raise :class:`ProtocolError`.
    """

    __slots__ = ("_buf", "_expected", "_need", "max_count", "max_value_size")

    def __init__(
        self, *, max_value_size: int = 1 << 40, max_count: int = MAX_KEY_COUNT * 8
    ) -> None:
        self._buf = bytearray()
        self._need = 0
        self._expected: deque[tuple[Reply, int]] = deque()
        self.max_value_size = max_value_size
        self.max_count = max_count

    @property
    def pending(self) -> int:
        """Number of responses expected but not yet complete."""
        return len(self._expected)

    def expect(self, reply: Reply, count: int = 0) -> None:
        """Announce the next response's shape (``count`` for :attr:`Reply.BYTES_LIST`)."""
        self._expected.append((reply, count))

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Parse ``data``; return the values of the responses it completes."""
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return []
            buf = bytes(self._buf)
            self._buf = bytearray()
        else:
            buf = bytes(data)
        out: list[Any] = []
        pos = 0
        end = len(buf)
        expected = self._expected
        try:
            while expected:
                kind, count = expected[0]
                value, pos = self._parse(buf, pos, end, kind, count)
                expected.popleft()
                out.append(value)
        except _Incomplete as inc:
            self._buf = bytearray(buf[pos:])
            self._need = inc.end - pos
        else:
            if pos < end:
                raise ProtocolError(
                    f"server sent {end - pos} unexpected bytes (no request pending)"
                )
        return out

    def _string(self, buf: bytes, p: int, end: int) -> tuple[bytes, int]:
        q = p + 8
        if q > end:
            raise _Incomplete(q)
        (n,) = _U64.unpack_from(buf, p)
        if n > self.max_value_size:
            raise ProtocolError(f"response length {n} exceeds {self.max_value_size} bytes")
        e = q + n
        if e > end:
            raise _Incomplete(e)
        return buf[q:e], e

    def _parse(self, buf: bytes, p: int, end: int, kind: Reply, count: int) -> tuple[Any, int]:
        if kind == 0:
            return self._string(buf, p, end)
        if kind == 2:
            if p >= end:
                raise _Incomplete(p + 1)
            return buf[p], p + 1
        if kind == 1:
            q = p + 8
            if q > end:
                raise _Incomplete(q)
            return _I64.unpack_from(buf, p)[0], q
        if kind == 3:
            q = p + 4
            if q > end:
                raise _Incomplete(q)
            return _U32.unpack_from(buf, p)[0], q
        if kind == 6:
            q = p + 8
            if q > end:
                raise _Incomplete(q)
            (flag,) = _I64.unpack_from(buf, p)
            if flag == 0:
                return None, q
            return self._string(buf, q, end)
        if kind == 5:
            q = p + 8
            if q > end:
                raise _Incomplete(q)
            (count,) = _I64.unpack_from(buf, p)
            if count < 0 or count > self.max_count:
                raise ProtocolError(f"LIST_KEYS count {count} is out of range")
            p = q
        values = []
        for _ in range(count):
            v, p = self._string(buf, p, end)
            values.append(v)
        return values, p
