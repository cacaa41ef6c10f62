"""Peer copies of checkpoints (``_peer_copies``): real files, a real store, real TCP on loopback."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic.checkpoint import _layout as L
from aelastic.checkpoint import _peer_copies
from aelastic.checkpoint._agent import Checkpoints
from aelastic.checkpoint._landing import Landed, Landing
from aelastic.checkpoint._peer_copies import KEY, PeerCopies, PeerRound, open_peer_copies
from aelastic.checkpoint._wire import SEND_CHUNK as CHUNK
from aelastic.store import LocalStore

from .test_checkpoint_agent import commit

#: sockets driven by anyio's waits (``_wire``): every backend (asyncio, uvloop, trio)
pytestmark = pytest.mark.anyio

#: No background copies: the tests call ``push()`` themselves.
MANUAL = 3600.0


def held(root: Path, step: int, rank: int) -> bytes | None:
    """The bytes of ``rank``'s file of ``step`` (world 2) in ``root``, None if absent."""
    path = Path(L.rank_file(str(root), step, rank, 2))
    return path.read_bytes() if path.exists() else None


def peer_round(store: LocalStore, group_rank: int, world: int, ranks: tuple[int, ...]) -> PeerRound:
    return PeerRound(store, group_rank, world, ranks, "127.0.0.1", "127.0.0.1")


async def test_a_step_is_copied_to_the_next_node_and_a_replacement_fetches_it(
    tmp_path: Path,
) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    big = os.urandom(3 * CHUNK + 5)  # several chunks, the last one short
    for step in (2, 4, 6):
        commit(a, step, 0, 2, big if step == 6 else b"old")
    commit(b, 6, 1, 2)
    async with a_pushing_to_b(a, b) as ra:  # each offered nothing newer to the other
        await ra.push()
        await ra.push()  # the same step again: nothing to do
        assert ra.pushed_step == 6
    assert held(b, 6, 0) == big
    assert held(b, 6, 1) == b"x" * 100  # its own rank untouched
    assert not [n for n in os.listdir(b) if n.endswith(".tmp")]

    # Node a is lost; c takes its place (rank 0) and finds nothing in its own memory.
    envs = await resume_b_and_c(b, c)
    assert envs["b"][L.STEP_ENV] == envs["c"][L.STEP_ENV] == "6"
    assert held(c, 6, 0) == big


async def resume_b_and_c(b: Path, c: Path) -> dict[str, dict[str, str]]:
    """The round after node a (group rank 0, rank 0) was lost: b keeps group rank 1 and
    rank 1, a new node c takes group rank 0 and rank 0. Each agent's resume_env."""
    store = LocalStore()
    envs: dict[str, dict[str, str]] = {}
    async with open_peer_copies(str(b), 1, MANUAL) as rb, open_peer_copies(str(c), 1, MANUAL) as rc:
        nodes = {
            "b": (Checkpoints(str(b), None, lambda *_: None, rb), 1, [1]),
            "c": (Checkpoints(str(c), None, lambda *_: None, rc), 0, [0]),
        }

        async def resume(name: str) -> None:
            node, group_rank, ranks = nodes[name]
            envs[name] = await node.resume_env(
                ranks, store, group_rank, 2, address=("127.0.0.1", "127.0.0.1")
            )

        async with anyio.create_task_group() as tg:
            for name in nodes:
                tg.start_soon(resume, name)
    return envs


@contextlib.asynccontextmanager
async def joined_pair(
    a: Path, b: Path, store: LocalStore
) -> AsyncIterator[tuple[PeerCopies, PeerCopies, list[PeerRound]]]:
    """Nodes a (group rank 0, rank 0) and b (group rank 1, rank 1) of a round on
    ``store``, joined (not started); their peer copies and rounds, until the block ends."""
    async with open_peer_copies(str(a), 1, MANUAL) as ra, open_peer_copies(str(b), 1, MANUAL) as rb:
        rounds = [peer_round(store, 0, 2, (0,)), peer_round(store, 1, 2, (1,))]
        async with anyio.create_task_group() as tg:
            tg.start_soon(ra.join, rounds[0])
            tg.start_soon(rb.join, rounds[1])
        yield ra, rb, rounds


@contextlib.asynccontextmanager
async def a_pushing_to_b(a: Path, b: Path) -> AsyncIterator[PeerCopies]:
    """:func:`joined_pair`, a's peer copies started (its ``push()`` copies to b), until the
    block ends."""
    async with joined_pair(a, b, LocalStore()) as (ra, _, rounds):
        ra.started(rounds[0])
        yield ra


def copies_in(root: Path, rank: int = 0) -> list[int]:
    """The steps of ``rank`` held in ``root``."""
    return sorted(s for s, step in L.scan(str(root)).items() if step.holds_any([rank]))


def metadata(root: Path, step: int, data: bytes | None = None) -> bytes | None:
    """The DCP ``.metadata`` of ``step`` in ``root`` (None if absent); written first if
    ``data`` is given."""
    path = Path(L.step_dir(str(root), step), L.METADATA)
    if data is not None:
        path.write_bytes(data)
    return path.read_bytes() if path.exists() else None


async def test_a_dcp_steps_metadata_travels_with_its_copies(tmp_path: Path) -> None:
    # DCP's coordinator wrote .metadata on node a only; b gets it with a's push, and a
    # replacement c for a gets it with its fetch from b
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    data = os.urandom(3000)
    commit(a, 6, 0, 2)
    metadata(a, 6, data)
    commit(b, 6, 1, 2)
    async with a_pushing_to_b(a, b) as ra:
        await ra.push()
        # the coordinator writes .metadata once every rank wrote: after a push, at times
        commit(a, 8, 0, 2)
        await ra.push()
        assert held(b, 8, 0) == b"x" * 100 and metadata(b, 8) is None
        metadata(a, 8, data[::-1])
        await ra.push()  # step 8 again: its metadata only
    assert metadata(b, 8) == data[::-1]
    assert metadata(b, 6) == data
    assert held(b, 6, 0) == b"x" * 100
    assert not [n for d in (b, b / "step_000000000006") for n in os.listdir(d) if ".tmp" in n]

    # A DCP step is read whole: step 8 lacks rank 1's file anywhere, so the round
    # resumes from 6, and c fetches both of its rank files and its metadata from b.
    envs = await resume_b_and_c(b, c)
    assert envs["b"][L.STEP_ENV] == envs["c"][L.STEP_ENV] == "6"
    assert metadata(c, 6) == data
    assert held(c, 6, 0) == held(c, 6, 1) == b"x" * 100
    assert sorted(L.scan(str(c))) == [6]


async def _pushed_by_a(
    a: Path,
    b: Path,
    steps: list[int],
    data: dict[int, bytes],
    after_each: Callable[[], None] = lambda: None,
) -> None:
    """Node a saves each of ``steps`` in turn (keeping two, like a worker) and pushes it
    to node b; ``after_each()`` after each push. Node b holds a step of its own rank
    (step 1: a node takes copies once its workers saved)."""
    if not copies_in(b, 1):
        commit(b, 1, 1, 2)
    async with a_pushing_to_b(a, b) as ra:
        for step in steps:
            commit(a, step, 0, 2, data[step])
            L.prune(str(a), [0])
            await ra.push()
            after_each()


async def test_a_copy_reuses_the_pages_of_the_oldest_copy_it_replaces(tmp_path: Path) -> None:
    # b keeps two steps of a's rank: from the third copy on, each is written into the
    # file of the older one (its tmpfs pages: no new pages to fault in and zero)
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    data = {s: os.urandom(2 * CHUNK + s) for s in (2, 4)} | {6: os.urandom(CHUNK // 2)}
    await _pushed_by_a(a, b, [2, 4], data)
    inode_2 = os.stat(L.rank_file(str(b), 2, 0, 2)).st_ino
    await _pushed_by_a(a, b, [6], data)
    assert copies_in(b) == [4, 6]  # step 2 went with the copy of 6
    assert os.stat(L.rank_file(str(b), 6, 0, 2)).st_ino == inode_2
    assert (held(b, 4, 0), held(b, 6, 0)) == (data[4], data[6])  # shorter: cut to size
    assert not [n for n in os.listdir(b) if n.startswith(".")]


async def test_new_pages_are_allocated_a_chunk_ahead_of_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a copy into new pages: each byte lands in pages allocated before it arrives, a
    # chunk at a time (small chunks here: many of them), and the file comes out whole
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    monkeypatch.setattr(_peer_copies, "ALLOCATE_FIRST", 1 << 16)
    monkeypatch.setattr(_peer_copies, "ALLOCATE_MOST", 1 << 18)
    ends: list[int] = []
    real_allocate = Landing.allocate

    def allocate(self: Landing, landed: Landed, end: int) -> None:
        ends.append(end)
        real_allocate(self, landed, end)

    monkeypatch.setattr(Landing, "allocate", allocate)
    data = {2: os.urandom(3 * CHUNK + 12345)}
    await _pushed_by_a(a, b, [2], data)
    assert held(b, 2, 0) == data[2]
    size = len(data[2])
    assert ends[0] == 1 << 16 and ends[-1] == size and ends == sorted(ends)
    assert len(ends) > size // (1 << 18)  # in chunks of at most 256 KiB
    assert os.stat(L.rank_file(str(b), 2, 0, 2)).st_blocks * 512 >= size


async def test_shared_memory_running_out_mid_copy_loses_only_that_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # /dev/shm fills while a copy arrives: the copy is dropped (no temporary file left,
    # no fault while writing), the step the peer held before stays, a warning says why
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    data = {2: b"two" * 1000, 4: os.urandom(3 * CHUNK)}
    await _pushed_by_a(a, b, [2], data)
    monkeypatch.setattr(_peer_copies, "ALLOCATE_FIRST", 1 << 16)
    calls = 0
    real_allocate = Landing.allocate

    def allocate(self: Landing, landed: Landed, end: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_allocate(self, landed, end)

    monkeypatch.setattr(Landing, "allocate", allocate)
    with caplog.at_level(logging.WARNING, "aelastic.checkpoint"):
        await _pushed_by_a(a, b, [4], data)
    assert calls >= 3
    assert copies_in(b) == [2] and held(b, 2, 0) == data[2]
    assert not [n for n in os.listdir(b) if n.startswith(".")]
    assert "No space left on device" in caplog.text


def _mapped(root: Path) -> list[str]:
    """The files under ``root`` this process maps (`` (deleted)`` kept: a mapping that
    holds the memory of a file no longer there)."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sorted({line.split(None, 5)[5] for line in lines if f" {root}/" in line})


async def test_the_receiver_maps_only_the_files_it_holds(tmp_path: Path) -> None:
    # the receiver keeps the mapping of each file it received (the next copy into those
    # pages finds their page tables filled), and drops it with the file
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()

    def only_the_held_files_mapped() -> None:
        kept = [L.rank_file(str(b), s, 0, 2) for s in copies_in(b)]
        assert _mapped(b) == kept

    data = {s: os.urandom(CHUNK + s) for s in (2, 4, 6, 8)}
    await _pushed_by_a(a, b, [2, 4, 6, 8], data, only_the_held_files_mapped)
    assert copies_in(b) == [6, 8]
    assert _mapped(b) == []


async def test_a_step_saved_over_while_it_is_copied_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a worker's save takes over the file being copied (renames it away, then writes):
    # the peer keeps the step it held, not a mix of two steps under the older one's name
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    data = {2: b"two" * 1000, 4: b"four" * 100_000}
    await _pushed_by_a(a, b, [2], data)
    real_open = _peer_copies._open_files

    def open_then_saved_over(memory_dir: str, step: int, world: int, ranks: Any) -> Any:
        opened = real_open(memory_dir, step, world, ranks)
        os.rename(opened.paths[0], os.path.join(memory_dir, ".taken_over"))
        return opened

    monkeypatch.setattr(_peer_copies, "_open_files", open_then_saved_over)
    await _pushed_by_a(a, b, [4], data)
    assert copies_in(b) == [2] and held(b, 2, 0) == data[2]
    assert not [n for n in os.listdir(b) if n.startswith(".")]


async def test_the_agreement_counts_a_fetched_peer_copy(tmp_path: Path) -> None:
    b, c = tmp_path / "b", tmp_path / "c"
    for step in (6, 8):
        commit(b, step, 1, 2)
        commit(b, step, 0, 2, b"copy %d" % step)  # the copies of the lost node's rank 0
    c.mkdir()
    envs = await resume_b_and_c(b, c)
    assert envs["b"][L.STEP_ENV] == envs["c"][L.STEP_ENV] == "8"
    # only the step agreed on comes over
    assert (held(c, 6, 0), held(c, 8, 0)) == (None, b"copy 8")


async def test_a_dead_peer_costs_only_its_copy(tmp_path: Path) -> None:
    a = tmp_path / "a"
    commit(a, 3, 0, 2)
    store = LocalStore()
    # Node 1 announced a listener that is gone: nothing listens on that port any more.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    await store.set(f"{KEY}/1", json.dumps({"host": "127.0.0.1", "port": port, "holds": True}))
    async with open_peer_copies(str(a), 1, MANUAL) as ra:
        pr = peer_round(store, 0, 2, (0,))
        with anyio.fail_after(10):
            assert await ra.join(pr) is None
            ra.started(pr)
            await ra.push()  # logged, not raised
    assert ra.pushed_step == 3  # tried; the next newer step is tried again
    assert sorted(L.scan(str(a))) == [3]


async def test_a_node_without_copies_holds_no_one_up(tmp_path: Path) -> None:
    """One node runs with ``--checkpoint-peer-copies 0``: it announces that, and the other
    neither waits for its listener (10 s) nor tries to copy to it."""
    a, b = tmp_path / "a", tmp_path / "b"
    commit(a, 2, 0, 2)
    commit(b, 2, 1, 2)
    store = LocalStore()
    async with open_peer_copies(str(a), 1, MANUAL) as ra:
        nodes = [
            (Checkpoints(str(a), None, lambda *_: None, ra), 0),
            (Checkpoints(str(b), None, lambda *_: None), 1),  # no copies
        ]
        envs: list[dict[str, str]] = [{}, {}]

        async def resume(i: int) -> None:
            node, group_rank = nodes[i]
            envs[i] = await node.resume_env(
                [group_rank], store, group_rank, 2, address=("127.0.0.1", "127.0.0.1")
            )

        with anyio.fail_after(5):  # well below the 10 s wait for a missing announcement
            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(resume, i)
            await ra.push()
    assert [e[L.STEP_ENV] for e in envs] == ["2", "2"]
    assert ra.pushed_step == 2 and held(b, 2, 0) is None  # nothing sent to b
