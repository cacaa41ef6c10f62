"""The HTTP endpoints (health, dashboard) against seeded garbage and mutated requests.

The long mode is ``python benchmarks/fuzz.py --target http --seconds 60 --seed S``.
"""

from __future__ import annotations

import socket

import anyio
import pytest

from aelastic.health._server import serve_routes

from . import _fuzz


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzed_requests_are_refused_and_the_endpoint_keeps_answering(seed: int) -> None:
    counts = anyio.run(lambda: _fuzz.run(seed, cases=100))
    assert counts["cases"] == 100
    assert counts.get("answer 200", 0) > 0  # some mutations stay valid requests
    assert sum(v for k, v in counts.items() if k.startswith("answer 4")) > 0


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_large_body_is_refused_with_413() -> None:
    body = b"x" * 100_000
    request = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            _, port = await tg.start(
                lambda task_status: serve_routes(
                    _fuzz._route, "127.0.0.1", 0, task_status=task_status
                )
            )
            answer = await anyio.to_thread.run_sync(_exchange, port, request)
            tg.cancel_scope.cancel()
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:100]

    anyio.run(main)
