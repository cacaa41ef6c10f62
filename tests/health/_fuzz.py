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
import time

import anyio

from aelastic.health import Response, serve_routes

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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


async def run(
    seed: int, *, cases: int | None = None, seconds: float | None = None
) -> dict[str, int]:
    """Fuzz a fresh endpoint for ``cases`` cases or ``seconds`` seconds; counts by kind and
    by answer. Raises AssertionError naming the seed when a property does not hold."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    rss0 = peak = _rss()
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
        end = None if seconds is None else time.monotonic() + seconds
        i = 0
        while (cases is None or i < cases) and (end is None or time.monotonic() < end):
            kind, data = mutate(rng)
            try:
                answer = await _case(port, data, rng.random() < 0.7)
            except TimeoutError:
                raise AssertionError(
                    f"seed {seed}, case {i} ({kind}, {data[:64]!r}...): the server kept the "
                    f"connection open over {CLOSE_BOUND} s"
                ) from None
            status = "none" if not answer else answer[:12].decode("latin-1")
            assert not answer or status.startswith("HTTP/1.1 "), (seed, i, kind, answer[:80])
            counts[kind] = counts.get(kind, 0) + 1
            key = f"answer {status[9:12]}" if answer else "closed unanswered"
            counts[key] = counts.get(key, 0) + 1
            if i % 20 == 0:
                valid = await _case(port, _VALID, True)
                assert valid.startswith(b"HTTP/1.1 200 "), (seed, i, valid[:80])
                peak = max(peak, _rss())
            i += 1
        counts["cases"] = i
        tg.cancel_scope.cancel()
    growth = max(peak, _rss()) - rss0
    counts["rss_growth_kib"] = growth // 1024
    assert growth < 256 * 2**20, f"seed {seed}: the process grew by {growth} bytes"
    return counts
