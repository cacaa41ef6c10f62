"""A seeded fuzzer of the checkpoint peer listener (issue 37)::

    python benchmarks/fuzz.py --target peer --seconds 60 --seed 1

* the checkpoint peer listener (``aelastic.checkpoint._peer_copies``) on loopback,
  holding a step of its own. Each case is one connection: random bytes; a handshake
  answer mutated from a valid one; after a valid handshake, a request mutated from a
  valid push, fetch or metadata header, sent with its MAC (it reaches the parser) or
  as it is (the MAC check refuses it). Each connection is half-closed after its bytes
  and must be closed by the listener within :data:`CLOSE_BOUND` seconds; every
  :data:`CHECK_EVERY` cases a valid client must still fetch the step; at the end, no file
  may have appeared in the memory directory. A failure raises AssertionError naming the
  seed and the case. ``tests/checkpoint/test_peer_fuzz.py`` runs a few seconds of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import anyio
from _fuzzing import Memory, run_cases

#: The longest a bad connection may stay open after its bytes (the listener's own bound
#: is one IO timeout, 10 s).
CLOSE_BOUND = 30.0
CHECK_EVERY = 25
KEY = b"fuzz job key"

_TEMPLATES: list[dict[str, Any]] = [
    {"op": "push", "step": 4, "world": 2, "files": [[0, 64]]},
    {"op": "push", "step": 4, "world": 2, "files": [[0, 64]], "metadata": 16},
    {"op": "fetch", "ranks": [1], "step": 7, "world": 2},
    {"op": "metadata", "step": 3, "size": 16},
]
_ODD_VALUES: list[Any] = [
    -5, -1, 0, 1, 10**13, 1 << 62, 1 << 40, 3.5, "1", None, True, [], {}, [[0, 1]] * 5000,
    [[-1, 5]], [[0, -5]], [[1, 5]], [[0, 5], [0, 5]], "x" * 3000,
]  # fmt: skip


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif choice < 0.7:
            out.insert(rng.randrange(len(out) + 1), rng.randrange(256))
        elif out:
            del out[rng.randrange(len(out))]
    return bytes(out)


def _mutate_request(rng: random.Random) -> bytes:
    """A request's JSON: a template with a field changed to an odd value, or its bytes
    mutated (often not JSON any more)."""
    request = dict(rng.choice(_TEMPLATES))
    if rng.random() < 0.6:
        request[rng.choice([*request, "op"])] = rng.choice(_ODD_VALUES)
        return json.dumps(request).encode()
    return _mutate_bytes(rng, json.dumps(request).encode())


async def _until_closed(stream: anyio.abc.SocketStream) -> None:
    """Read until the listener closes the connection (within :data:`CLOSE_BOUND`)."""
    with anyio.fail_after(CLOSE_BOUND):
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            while await stream.receive():
                pass


async def _raw_case(port: int, data: bytes) -> None:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        with contextlib.suppress(OSError, anyio.BrokenResourceError):
            await stream.send(data)
            await stream.send_eof()
        await _until_closed(stream)


async def _bad_handshake_case(port: int, rng: random.Random) -> None:
    from aelastic.checkpoint import _peerauth as A

    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        with anyio.fail_after(CLOSE_BOUND):
            hello = b""
            while not hello.endswith(b"\n"):
                hello += await stream.receive()
        server_nonce = bytes.fromhex(json.loads(hello)["nonce"])
        client_nonce = os.urandom(A.NONCE_BYTES)
        key = KEY if rng.random() < 0.5 else b"another job"
        proof = A.client_proof(key, server_nonce, client_nonce).hex()
        line = json.dumps({"nonce": client_nonce.hex(), "proof": proof}).encode()
        if key == KEY:  # the right key, bytes of the answer changed
            while (mutated := _mutate_bytes(rng, line)) == line:
                pass
            line = mutated
        with contextlib.suppress(OSError, anyio.BrokenResourceError):
            await stream.send(line + b"\n")
            await stream.send_eof()
        await _until_closed(stream)


async def _after_handshake_case(port: int, rng: random.Random) -> None:
    from aelastic.checkpoint._wire import connect

    body = _mutate_request(rng)
    async with connect("127.0.0.1", port, 10.0, KEY) as conn:
        mac = conn._mac
        assert mac is not None
        line = mac.seal(body) if rng.random() < 0.7 else body
        if rng.random() < 0.2:
            line = _mutate_bytes(rng, line)
        await conn.send(line + b"\n" + os.urandom(rng.randrange(0, 200)))
        conn.sock.shutdown(socket.SHUT_WR)
        with anyio.fail_after(CLOSE_BOUND):
            with contextlib.suppress(anyio.EndOfStream, OSError, ValueError):
                while True:
                    await conn.receive_into(memoryview(bytearray(1)))


async def _valid_fetch(port: int) -> None:
    from aelastic.checkpoint._wire import connect

    async with connect("127.0.0.1", port, 10.0, KEY) as conn:
        await conn.send_line({"op": "fetch", "ranks": [1], "step": 7, "world": 2})
        header = await conn.receive_line()
        assert header == {"world": 2, "files": [[1, 100]]}, header
        data = bytearray(100)
        await conn.receive_into(memoryview(data))
        assert bytes(data) == b"s" * 100
        await conn.send_line("held")
        assert (await conn.receive_line()) == {"whole": True}


def _files(root: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


async def peer(seconds: float, seed: int) -> dict[str, int]:
    """Fuzz the checkpoint peer listener for ``seconds``; the counts of each case."""
    from aelastic.checkpoint import _layout as L
    from aelastic.checkpoint._peer_copies import KEY as ANNOUNCED
    from aelastic.checkpoint._peer_copies import PeerRound, open_peer_copies
    from aelastic.store import LocalStore

    rng = random.Random(seed)
    counts = {"raw": 0, "handshake": 0, "request": 0, "valid": 0}
    memory = Memory()
    with tempfile.TemporaryDirectory(prefix="aelastic_fuzz_") as root:
        own = L.rank_file(root, 7, 1, 2)  # its own step (no template names it)
        os.makedirs(os.path.dirname(own))
        with open(own, "wb") as f:  # noqa: ASYNC230  (before anything runs)
            f.write(b"s" * 100)
        store = LocalStore()
        async with open_peer_copies(root, 1, 3600.0, key=KEY) as peers:
            await peers.join(PeerRound(store, 1, 2, (1,), "127.0.0.1", "127.0.0.1"))
            port = int(json.loads(await store.get(f"{ANNOUNCED}/1"))["port"])
            before = _files(root)

            async def one_case(kind: str) -> list[str]:
                if kind == "raw":
                    size = rng.choice((0, 1, 10, 100, 2000))
                    await _raw_case(port, rng.randbytes(size))
                elif kind == "handshake":
                    await _bad_handshake_case(port, rng)
                else:
                    await _after_handshake_case(port, rng)
                return [kind]

            def one(i: int) -> tuple[str, Awaitable[list[str]]]:
                kind = rng.choice(("raw", "handshake", "request", "request"))
                return kind, one_case(kind)

            async def check(i: int) -> None:
                await _valid_fetch(port)
                counts["valid"] += 1

            await run_cases(
                seed, one, check, every=CHECK_EVERY, bound=CLOSE_BOUND, seconds=seconds,
                counts=counts, memory=memory,
            )  # fmt: skip
            await _valid_fetch(port)
            counts["valid"] += 1
            after = _files(root)
            assert after == before, f"seed {seed}: files appeared: {set(after) - set(before)}"
    memory.check(seed, counts)
    return counts


async def run(seed: int, *, seconds: float) -> dict[str, int]:
    """``benchmarks/fuzz.py --target peer``: :func:`peer` for ``seconds``, the refusal
    lines (one per case) off."""
    logging.getLogger("aelastic").setLevel(logging.ERROR)
    return await peer(seconds, seed)
