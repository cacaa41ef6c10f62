"""A seeded fuzzer of a live StoreServer on 127.0.0.1 (used by test_store_fuzz.py and by
``benchmarks/fuzz.py --target store``).

Each case opens a raw connection, sends random bytes or a mutation of valid requests
(truncated, bytes flipped, a length field made huge, an opcode replaced, a wrong type),
then either half-closes or stays silent, and reads until the server closes the
connection. Every few cases a real client sets and gets a key. What must hold: the
server closes every connection within a bound, a real client is always answered, no
connection's task fails with an exception (logged by the server), and the process's
memory does not grow by more than a bound.
"""

from __future__ import annotations

import logging
import random
import struct
from collections.abc import Awaitable
from contextlib import AsyncExitStack

import anyio
from _fuzzing import Memory, run_cases

from aelastic.store import StoreServer, TCPStoreClient
from aelastic.store import _protocol as P

#: the server's frame_timeout during fuzzing: a partial request is dropped this soon
FRAME_TIMEOUT = 0.5
#: the longest the server may take to close a fuzzed connection (generous: a loaded machine)
CLOSE_BOUND = 20.0
_UNKNOWN_OPS = [op for op in range(19, 256) if op not in (0xA0, 0xA1, 0xA2, 0xA3)]
#: kinds whose bytes can never end on a request boundary: the server must close the
#: connection even when the peer stays silent (no half-close)
_MUST_CLOSE = ("random", "huge", "opcode", "idle")
_HUGE = (2**40, 2**63, 2**64 - 1, P.MAX_VALUE_SIZE + 1, P.MAX_KEY_SIZE + 1)


class _Failures(logging.Handler):
    """Counts records logged with a traceback (a connection's task that failed)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


def _valid(rng: random.Random) -> bytes:
    key = rng.randbytes(rng.randrange(0, 12))
    value = rng.randbytes(rng.randrange(0, 64))
    return rng.choice(
        [
            P.request_set(key, value),
            P.request_get(key),
            P.request_add(key, rng.randrange(-5, 5)),
            P.request_check([key]),
            P.request_compare_set(key, value, value[::-1]),
            P.request_num_keys(),
            P.request_delete_key(key),
            P.request_append(key, value),
            P.request_multi_get([key, key]),
            P.request_multi_set([key], [value]),
            P.request_queue_push(key, value),
            P.request_queue_len(key),
            P.request_list_keys(),
            P.request_ping(rng.randrange(2**32)),
            P.request_ae_hello(),
        ]
    )


def mutate(rng: random.Random) -> tuple[str, bytes]:
    """One fuzz case: (its kind, the bytes to send)."""
    kind = rng.choice(
        ["random", "truncate", "flip", "huge", "opcode", "wrong_type", "valid", "idle"]
    )
    if kind == "idle":
        return kind, b""  # connects and sends nothing: closed for want of VALIDATE
    if kind == "random":
        return kind, rng.randbytes(rng.randrange(1, 200))
    body = P.request_validate() + b"".join(_valid(rng) for _ in range(rng.randrange(1, 4)))
    data = bytearray(body)
    if kind == "truncate":
        data = data[: rng.randrange(1, len(data))]
    elif kind == "flip":
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "huge":
        # a request whose key or value length claims far more than is sent
        op = rng.choice([P.Opcode.SET, P.Opcode.GET, P.Opcode.APPEND, P.Opcode.CHECK])
        data = bytearray(P.request_validate()) + bytes([op]) + struct.pack("<Q", rng.choice(_HUGE))
        data += rng.randbytes(rng.randrange(0, 64))
    elif kind == "opcode":
        data = bytearray(P.request_validate()) + bytes([rng.choice(_UNKNOWN_OPS)])
        data += rng.randbytes(rng.randrange(0, 32))
    elif kind == "wrong_type":
        key = b"k%d" % rng.randrange(4)
        data += P.request_set(key, b"not a number") + P.request_add(key, 1)
    return kind, bytes(data)


async def _case(port: int, data: bytes, half_close: bool) -> str:
    """Send ``data``; read until the server closes: 'closed' or 'reset'. Raises
    TimeoutError when the server keeps the connection past :data:`CLOSE_BOUND`."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        try:
            if data:
                await stream.send(data)
            if half_close:
                await stream.send_eof()
        except (anyio.BrokenResourceError, OSError):
            return "reset"
        with anyio.fail_after(CLOSE_BOUND):
            while True:
                try:
                    await stream.receive(65536)
                except anyio.EndOfStream:
                    return "closed"
                except (anyio.BrokenResourceError, OSError):
                    return "reset"


async def run(
    seed: int, *, cases: int | None = None, seconds: float | None = None
) -> dict[str, int]:
    """Fuzz a fresh server for ``cases`` cases or ``seconds`` seconds; the counts by kind.

    Raises AssertionError naming the seed when a property does not hold.
    """
    rng = random.Random(seed)
    failures = _Failures()
    logger = logging.getLogger("aelastic.store")
    logger.addHandler(failures)
    memory = Memory()
    try:
        async with AsyncExitStack() as stack:
            server = StoreServer("127.0.0.1", 0, frame_timeout=FRAME_TIMEOUT)
            await stack.enter_async_context(server)
            client = TCPStoreClient("127.0.0.1", server.port, timeout=30)
            await stack.enter_async_context(client)

            async def one_case(kind: str, data: bytes, half_close: bool) -> list[str]:
                return [kind, await _case(server.port, data, half_close)]

            def one(i: int) -> tuple[str, Awaitable[list[str]]]:
                kind, data = mutate(rng)
                # most cases half-close; the others test the timeouts (a silent peer)
                half_close = kind not in _MUST_CLOSE or rng.random() < 0.5
                return f"{kind}, {data[:64]!r}...", one_case(kind, data, half_close)

            async def check(i: int) -> None:
                with anyio.fail_after(30):
                    await client.set("fuzz/alive", str(i))
                    assert await client.get("fuzz/alive") == str(i).encode()

            counts = await run_cases(
                seed, one, check, every=20, bound=CLOSE_BOUND, cases=cases, seconds=seconds,
                memory=memory,
            )  # fmt: skip
            assert server.buffered_bytes <= server.limits.max_buffered_bytes
            with anyio.fail_after(30):
                assert await client.get("fuzz/alive") is not None
    finally:
        logger.removeHandler(failures)
    assert not failures.records, f"seed {seed}: {failures.records[0].getMessage()}"
    memory.check(seed, counts)
    return counts
