"""The live store server against seeded garbage and mutated requests (a few seconds).

The long mode is ``python benchmarks/fuzz.py --target store --seconds 60 --seed S``.
"""

from __future__ import annotations

import socket

import anyio
import pytest

from aelastic.store import StoreServer, TCPStoreClient
from aelastic.store._protocol import request_validate

from . import _fuzz


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzed_connections_are_closed_and_the_server_keeps_serving(seed: int) -> None:
    counts = anyio.run(lambda: _fuzz.run(seed, cases=100))
    assert counts["cases"] == 100
    # every kind of case ran (the seeds are fixed: this guards the generator itself)
    assert {"random", "truncate", "flip", "huge", "opcode", "wrong_type", "idle"} <= set(counts)


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the peer closes ``sock`` within ``within`` s (EOF or reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_silent_stranger_does_not_hold_a_slot() -> None:
    """A connection that never validates is closed after frame_timeout; a validated
    client that is merely idle is kept (torch's clients idle between requests)."""

    async def main() -> None:
        async with StoreServer("127.0.0.1", 0, frame_timeout=0.5) as server:
            # the idle one first: when the sweep closes the others, it is older than them
            idle = socket.create_connection(("127.0.0.1", server.port))
            idle.sendall(request_validate())
            silent = socket.create_connection(("127.0.0.1", server.port))
            half = socket.create_connection(("127.0.0.1", server.port))
            half.sendall(request_validate()[:3])  # a VALIDATE that never completes
            with silent, half, idle:
                for sock in (silent, half):
                    assert await anyio.to_thread.run_sync(_closed_by_peer, sock, 20.0)
                # the idle, validated one survived both sweeps: still served
                async with TCPStoreClient("127.0.0.1", server.port) as client:
                    await client.set("k", "v")
                assert not await anyio.to_thread.run_sync(_closed_by_peer, idle, 0.1)
                assert server.num_connections >= 1

    anyio.run(main)
