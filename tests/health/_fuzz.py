"""A seeded fuzzer of the HTTP endpoints (``serve_routes``, as the health endpoint and the
dashboard serve them) on 127.0.0.1; used by test_http_fuzz.py and ``benchmarks/fuzz.py
--target http``.

Each case sends random bytes or a mutation of a valid request (truncated, bytes flipped,
a huge header, a Content-Length or chunk size of 2^40, a large body, a bad method), then
half-closes or stays silent, and reads until the server closes. What must hold: every
connection is closed within a bound, an answer, if any, is an HTTP status line, a valid
request is always answered 200, and the process's memory grows by less than a bound.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable

import anyio
from _fuzzing import Memory, run_cases

from aelastic.health._http import Response
from aelastic.health._server import serve_routes

#: the server's connection timeout during fuzzing
CONNECTION_TIMEOUT = 0.5
#: the longest the server may take to close a fuzzed connection (generous: a loaded machine)
CLOSE_BOUND = 20.0
_VALID = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: fuzz\r\n\r\n"


def _route(method: str, path: str) -> Response:
    if path == "/healthz":
        return Response(200, "text/plain", b"ok\n")
    return Response(404, "text/plain", b"no\n")


def mutate(rng: random.Random) -> tuple[str, bytes]:
    """One fuzz case: (its kind, the bytes to send)."""
    kind = rng.choice(
        ["random", "truncate", "flip", "huge_header", "huge_length", "chunked", "body", "method"]
    )
    data = bytearray(_VALID)
    if kind == "random":
        data = bytearray(rng.randbytes(rng.randrange(1, 300)))
    elif kind == "truncate":
        data = data[: rng.randrange(1, len(data))]
    elif kind == "flip":
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "huge_header":
        data = data[:-2] + b"X-Big: " + b"a" * rng.choice([17_000, 40_000]) + b"\r\n\r\n"
    elif kind == "huge_length":
        length = rng.choice([2**40, 2**63, 10**30])
        data = data[:-2] + b"Content-Length: %d\r\n\r\n" % length + rng.randbytes(100)
    elif kind == "chunked":
        size = rng.choice([b"10000000000", b"ffffffffffffffffff", b"zz", b"4"])
        data = data[:-2] + b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabcd\r\n"
    elif kind == "body":
        body = rng.randbytes(rng.choice([10, 20_000, 100_000]))
        data = data[:-2] + b"Content-Length: %d\r\n\r\n" % len(body) + body
    elif kind == "method":
        data = rng.choice([b"POST", b"DELETE", b"\x00\xff", b"G ET"]) + data[3:]
    return kind, bytes(data)


async def _case(port: int, data: bytes, half_close: bool) -> bytes:
    """Send ``data``; the bytes answered until the server closes. Raises TimeoutError
    when the server keeps the connection past :data:`CLOSE_BOUND`."""
    answer = bytearray()
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        try:
            await stream.send(data)
            if half_close:
                await stream.send_eof()
        except (anyio.BrokenResourceError, OSError):
            return bytes(answer)
        with anyio.fail_after(CLOSE_BOUND):
            while True:
                try:
                    answer += await stream.receive(65536)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return bytes(answer)


async def run(
    seed: int, *, cases: int | None = None, seconds: float | None = None
) -> dict[str, int]:
    """Fuzz a fresh endpoint for ``cases`` cases or ``seconds`` seconds; counts by kind and
    by answer. Raises AssertionError naming the seed when a property does not hold."""
    rng = random.Random(seed)
    memory = Memory()
    async with anyio.create_task_group() as tg:
        _, port = await tg.start(
            lambda task_status: serve_routes(
                _route,
                "127.0.0.1",
                0,
                connection_timeout=CONNECTION_TIMEOUT,
                task_status=task_status,
            )
        )

        async def one_case(i: int, kind: str, data: bytes) -> list[str]:
            answer = await _case(port, data, rng.random() < 0.7)
            status = "none" if not answer else answer[:12].decode("latin-1")
            assert not answer or status.startswith("HTTP/1.1 "), (seed, i, kind, answer[:80])
            return [kind, f"answer {status[9:12]}" if answer else "closed unanswered"]

        def one(i: int) -> tuple[str, Awaitable[list[str]]]:
            kind, data = mutate(rng)
            return f"{kind}, {data[:64]!r}...", one_case(i, kind, data)

        async def check(i: int) -> None:
            valid = await _case(port, _VALID, True)
            assert valid.startswith(b"HTTP/1.1 200 "), (seed, i, valid[:80])

        counts = await run_cases(
            seed, one, check, every=20, bound=CLOSE_BOUND, cases=cases, seconds=seconds,
            memory=memory,
        )  # fmt: skip
        tg.cancel_scope.cancel()
    memory.check(seed, counts)
    return counts
