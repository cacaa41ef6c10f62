"""Who the checkpoint peer listener talks to (issue 37): the job's key, the bounds of a
push, the lazy start. A real listener on loopback, raw TCP clients."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from aelastic.checkpoint import _layout as L
from aelastic.checkpoint import _peer_copies
from aelastic.checkpoint._peer_copies import (
    KEY,
    KEY_KEY,
    PUSH_SIZE_FLOOR,
    SAVED_KEY,
    PeerCopies,
    open_peer_copies,
    push_refusal,
)
from aelastic.checkpoint._peerauth import PeerAuthError, read_key_file
from aelastic.checkpoint._wire import connect
from aelastic.store import LocalStore

from .test_checkpoint_agent import commit
from .test_checkpoint_peer_copies import MANUAL, joined_pair, peer_round

pytestmark = pytest.mark.anyio

LOG = "aelastic.checkpoint"


@contextlib.asynccontextmanager
async def serving(
    root: Path, key: bytes | None = None
) -> AsyncIterator[tuple[PeerCopies, int, bytes]]:
    """Node 1 of a two-node round (rank 1), holding step 2 of its rank: its listener
    runs. Yields it, its port and the job's key."""
    commit(root, 2, 1, 2)
    store = LocalStore()
    async with open_peer_copies(str(root), 1, MANUAL, key=key) as peers:
        await peers.join(peer_round(store, 1, 2, (1,)))
        port = json.loads(await store.get(f"{KEY}/1"))["port"]
        assert isinstance(port, int)
        job_key = key if key is not None else await store.get(KEY_KEY)
        yield peers, port, job_key


async def closed_without_answer(port: int, data: bytes) -> bytes:
    """Send ``data`` unauthenticated; what comes back before the listener closes."""
    got = b""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(data)
        with anyio.fail_after(30):
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    got += await stream.receive()
    return got


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOG
        and r.levelno == logging.WARNING
        and "refused a connection" in r.getMessage()
    ]


def files_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_a_client_without_the_key_is_refused_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a forged push of a far newer step, a fetch of the weights and a listing: each
    # gets only the listener's hello (a nonce) and is closed; one warning for the address
    caplog.set_level(logging.DEBUG, LOG)
    before = None
    async with serving(tmp_path) as (_, port, _):
        before = files_of(tmp_path)
        forged = b'{"op": "push", "step": 999999, "world": 4, "files": [[0, 5]]}\nevil!'
        fetch = b'{"op": "fetch", "ranks": [1], "step": 2, "world": 2}\n'
        listing = b'{"op": "list"}\n'
        for data in (forged, fetch, listing, forged):
            got = await closed_without_answer(port, data)
            hello = json.loads(got.decode())
            assert set(hello) == {"aelastic", "nonce"}  # nothing of the step's bytes
        assert files_of(tmp_path) == before  # nothing landed
    messages = refusals(caplog)
    assert len(messages) == 1, messages
    assert "127.0.0.1" in messages[0] and "no handshake" in messages[0]


async def test_a_peer_with_another_jobs_key_is_refused_both_ways(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOG)
    async with serving(tmp_path, key=b"this job") as (_, port, key):
        assert key == b"this job"
        for _ in range(3):
            # the listener closes first: the client sees the end of the stream
            with pytest.raises((PeerAuthError, anyio.EndOfStream)):
                async with connect("127.0.0.1", port, 10, b"another job"):
                    pass
        # the right key is served, and reads the step
        async with connect("127.0.0.1", port, 10, b"this job") as conn:
            await conn.send_line({"op": "fetch", "ranks": [1], "step": 2, "world": 2})
            assert (await conn.receive_line()) == {"world": 2, "files": [[1, 100]]}
    messages = refusals(caplog)
    assert len(messages) == 1 and "client does not hold this job's key" in messages[0]


async def test_a_listener_without_the_key_is_not_trusted_by_the_client(tmp_path: Path) -> None:
    # the client checks the listener's proof: a listener of another job sends nothing
    async with serving(tmp_path, key=b"other job") as (peers, port, _):
        with pytest.raises((PeerAuthError, anyio.EndOfStream)):
            async with connect("127.0.0.1", port, 10, b"this job"):
                pass
        assert peers.fetched_step is None


async def test_a_line_with_a_wrong_mac_after_the_handshake_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOG)
    async with serving(tmp_path) as (_, port, key), connect("127.0.0.1", port, 10, key) as conn:
        # a valid request with its MAC, then one byte of the JSON changed
        good = b'{"op": "fetch", "ranks": [1], "step": 2, "world": 3}'
        assert conn._mac is not None
        sealed = conn._mac.seal(good).replace(b'"world": 3', b'"world": 2')
        await conn.send(sealed + b"\n")
        with anyio.fail_after(30), pytest.raises(anyio.EndOfStream):
            await conn.receive_line()
    assert any("wrong MAC" in m for m in refusals(caplog))


async def test_oversized_malformed_and_negative_pushes_are_refused_with_a_reason(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (_, port, key):
        before = files_of(tmp_path)
        headers = [
            ({"op": "push", "step": -5, "world": 2, "files": [[0, 10]]}, "step -5"),
            ({"op": "push", "step": 4, "world": 2, "files": [[0, 1 << 40]]}, "a file of"),
            ({"op": "push", "step": 4, "world": 2, "files": [[2, 10]]}, "rank 2"),
            ({"op": "push", "step": 4, "world": 0, "files": [[0, 10]]}, "world 0"),
            ({"op": "push", "step": 4, "world": 2, "files": [[1, 10]]}, "own ranks"),
            ({"op": "push", "step": 4, "world": 2, "files": []}, "files"),
        ]
        for header, reason in headers:
            async with connect("127.0.0.1", port, 10, key) as conn:
                await conn.send_line(header)
                answer = await conn.receive_line()
                assert answer["retry"] is False and reason in answer["error"], answer
        assert files_of(tmp_path) == before
        assert not (tmp_path / "step_-00000000005").exists()


def test_the_bounds_of_what_peers_leave_on_a_node() -> None:
    own = {1: 1000}
    push = {"op": "push", "step": 4, "world": 4, "files": [[0, 4000]]}
    assert push_refusal(push, [1], own, {}, 1) is None
    # a node with no step of its own refuses, to be tried again
    assert push_refusal(push, [1], {}, {}, 1) == (
        "this node holds no step of its own yet (it takes copies once it saved)",
        True,
    )
    # a file above 4 x the node's largest, when that is above the floor
    big = {1: PUSH_SIZE_FLOOR}
    over = {**push, "files": [[0, 4 * PUSH_SIZE_FLOOR + 1]]}
    refusal = push_refusal(over, [1], big, {}, 1)
    assert refusal is not None and "a file of" in refusal[0]
    assert push_refusal({**over, "files": [[0, 4 * PUSH_SIZE_FLOOR]]}, [1], big, {}, 1) is None
    # the total: 8 x copies x the own step (here the floor); the pushed ranks' old
    # copies are not counted twice, the other ranks' are
    limit = 8 * 2 * PUSH_SIZE_FLOOR
    three = {**push, "files": [[0, PUSH_SIZE_FLOOR], [2, PUSH_SIZE_FLOOR]]}
    rest = limit - 4 * PUSH_SIZE_FLOOR  # this push, counted twice
    assert push_refusal(three, [1], own, {0: limit, 3: rest}, 2) is None
    refusal = push_refusal(three, [1], own, {3: rest + 1}, 2)
    assert refusal is not None and "more than" in refusal[0]
    assert refusal[1] is False


async def test_a_job_that_never_saves_opens_no_peer_port(tmp_path: Path) -> None:
    # two nodes join with nothing saved: neither listens; once one's workers save, it
    # says so in the store and both listen, and its push goes through
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    store = LocalStore()
    async with joined_pair(a, b, store) as (ra, rb, rounds):
        for g in (0, 1):
            announced = json.loads(await store.get(f"{KEY}/{g}"))
            assert announced["port"] is None and announced["pending"] is True
        assert ra.status()["port"] is rb.status()["port"] is None
        ra.started(rounds[0])
        rb.started(rounds[1])
        await ra.push()  # nothing saved: nothing said
        assert not await store.check([SAVED_KEY])

        commit(a, 2, 0, 2)  # a's workers save; b's have not yet
        await ra.push()
        assert await store.check([SAVED_KEY])
        with anyio.fail_after(30):  # b's listener starts on a's word
            while json.loads(await store.get(f"{KEY}/1"))["port"] is None:
                await store.wait([f"{KEY}/1"])
                await anyio.lowlevel.checkpoint()
        assert ra.pushed_step is None  # b held no step of its own: tried again
        commit(b, 2, 1, 2)
        await ra.push()
        assert ra.pushed_step == 2
    assert (b / "step_000000000002" / "rank_0_of_2.pt").read_bytes() == b"x" * 100


async def test_a_node_holding_steps_listens_when_the_round_starts(tmp_path: Path) -> None:
    async with serving(tmp_path) as (peers, port, _):
        assert peers.status()["port"] == port


def test_the_job_secret_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "secret"
    good.write_text("  s3cret\n")
    assert read_key_file(str(good)) == b"s3cret"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_key_file(str(empty))
    with pytest.raises(ValueError, match="cannot read the job secret"):
        read_key_file(str(tmp_path / "missing"))


def test_the_generated_key_is_kept_across_rounds() -> None:
    async def main() -> None:
        first, second = LocalStore(), LocalStore()
        key = await _peer_copies.agree_key(first)
        assert len(key) == 64 and key == await _peer_copies.agree_key(first, b"ignored")
        # the next round's store: a survivor proposes the key it knows
        assert await _peer_copies.agree_key(second, key) == key

    anyio.run(main)


_PLANT = """
import builtins, sys, torch

class Evil:
    def __reduce__(self):
        return (builtins.open, (sys.argv[2], "w"))

torch.save({"model": {"w": torch.zeros(2)}, "extra": Evil()}, sys.argv[1])
"""

_LOAD = """
import sys
from aelastic import checkpoint
try:
    checkpoint.load(rank=0)
except checkpoint.CheckpointError as exc:
    print("refused:", exc)
"""


def test_a_malicious_pickle_planted_as_a_peer_copy_never_runs(tmp_path: Path) -> None:
    # a file in the memory directory under a peer's rank (as if a push had put it
    # there): a worker's load refuses it (weights_only), and its code never runs
    import subprocess
    import sys

    memory = tmp_path / "memory"
    marker = tmp_path / "pwned"
    path = L.rank_file(str(memory), 9, 0, 2)
    Path(path).parent.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", _PLANT, path, str(marker)], check=True, timeout=120)
    assert not marker.exists()  # saving ran nothing
    env = {
        **os.environ,
        L.DIR_ENV: str(memory),
        L.STEP_ENV: "9",
        L.WORLD_ENV: "2",
        "RANK": "1",
        "WORLD_SIZE": "2",
    }
    done = subprocess.run(
        [sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "weights_only" in done.stdout, done.stdout
    assert not marker.exists()


async def test_connections_beyond_the_cap_are_closed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # strangers that connect and say nothing hold a slot each until IO_TIMEOUT: past the
    # cap the listener closes a new connection before its hello, and serves again once
    # a slot is free
    monkeypatch.setattr(_peer_copies, "MAX_CONNECTIONS", 3)
    async with serving(tmp_path) as (_, port, _), contextlib.AsyncExitStack() as silent:
        streams = []
        for _ in range(3):
            stream = await silent.enter_async_context(await anyio.connect_tcp("127.0.0.1", port))
            with anyio.fail_after(30):
                assert b"nonce" in await stream.receive()  # accepted, and counted
            streams.append(stream)
        assert await closed_without_answer(port, b"") == b""
        await streams[0].aclose()
        with anyio.fail_after(30):
            while True:  # the listener frees the slot when it sees the close
                async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                        if b"nonce" in await stream.receive():
                            break
