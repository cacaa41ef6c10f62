"""The agent's side of aelastic.checkpoint with real files and a real store (no torch:
the agent only moves the bytes workers wrote)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic.checkpoint import _layout as L
from aelastic.checkpoint._agent import Checkpoints, open_checkpoints
from aelastic.checkpoint._disk import write_step
from aelastic.checkpoint._owner import claim, release_if_empty, sweep_abandoned
from aelastic.checkpoint._settings import CheckpointSettings
from aelastic.store import LocalStore


def _no_peers(**values: Any) -> CheckpointSettings:
    """Settings of one node alone: no peer copies (their listener is another test's)."""
    return CheckpointSettings(peer_copies=0, **values)


def commit(root: Path, step: int, rank: int, world: int, data: bytes = b"x" * 100) -> None:
    path = Path(L.rank_file(str(root), step, rank, world))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.changed = anyio.Event()

    def __call__(self, name: str, metadata: Mapping[str, Any]) -> None:
        self.seen.append((name, dict(metadata)))
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, name: str) -> dict[str, Any]:
        while True:
            for seen, metadata in self.seen:
                if seen == name:
                    return metadata
            await self.changed.wait()


async def test_nodes_agree_on_the_newest_step_every_node_completed(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for step in (4, 6):  # node a (ranks 0, 1) completed 4 and 6
        commit(a, step, 0, 4)
        commit(a, step, 1, 4)
    commit(b, 4, 2, 4)  # node b (ranks 2, 3): rank 3 died writing step 6
    commit(b, 4, 3, 4)
    commit(b, 6, 2, 4)
    events = [Events(), Events()]
    nodes = [Checkpoints(str(d), None, e) for d, e in zip((a, b), events, strict=True)]
    store = LocalStore()
    envs: dict[int, dict[str, str]] = {}

    async def start(group_rank: int, ranks: list[int]) -> None:
        envs[group_rank] = await nodes[group_rank].resume_env(ranks, store, group_rank, 2)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, 0, [0, 1])
            tg.start_soon(start, 1, [2, 3])
    assert envs[0] == envs[1] == {L.STEP_ENV: "4", L.WORLD_ENV: "4"}
    assert events[0].seen == [
        ("aelastic.checkpoint.resume", {"step": 4, "world_size": 4, "bytes_held": 200})
    ]
    # the incomplete step 6 is gone from both nodes: the workers save it again
    assert sorted(L.scan(str(a))) == sorted(L.scan(str(b))) == [4]


def test_a_step_a_worker_took_over_while_copied_is_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, disk = tmp_path / "mem", tmp_path / "disk"
    commit(memory, 2, 0, 1, b"old")
    assert write_step(str(memory), str(disk), 2, 1, [0]) == 3
    commit(memory, 4, 0, 1, b"new step")
    source = L.rank_file(str(memory), 4, 0, 1)
    real_sendfile = os.sendfile

    def reuse_during_copy(out: int, src: int, offset: int, count: int) -> int:
        if os.path.exists(source):
            os.rename(source, source + ".reused")  # what save() does to the step it drops
        return real_sendfile(out, src, offset, count)

    monkeypatch.setattr(os, "sendfile", reuse_during_copy)
    assert write_step(str(memory), str(disk), 4, 1, [0]) == 0
    assert json.loads((disk / "manifest.json").read_text())["step"] == 2
    assert sorted(p.name for p in disk.iterdir()) == ["manifest.json", "step_000000000002"]


async def test_periodic_copy_then_last_copy_and_memory_freed_on_exit(tmp_path: Path) -> None:
    disk, events = tmp_path / "disk", Events()
    with anyio.fail_after(20):
        async with open_checkpoints(
            "run/1", _no_peers(dir=str(disk), persist_interval=0.01), events
        ) as cp:
            memory = Path(cp.memory_dir)
            assert memory.parent == Path("/dev/shm") and "run_1" in memory.name
            cp.local_ranks = (0, 1)
            commit(memory, 2, 0, 2)
            commit(memory, 2, 1, 2)
            assert (await events.wait_for("aelastic.checkpoint.persisted"))["step"] == 2
            assert cp.status()["bytes_held"] == 200 and cp.persisted_step == 2
            commit(memory, 4, 0, 2)
            commit(memory, 4, 1, 2, b"y" * 50)
            commit(memory, 6, 0, 2)  # rank 1 never finished step 6
    manifest = json.loads((disk / "manifest.json").read_text())
    assert manifest == {
        "format": manifest["format"],
        "dcp": False,  # plain saves: no DCP .metadata in the step
        "dir": "step_000000000004",
        "step": 4,
        "world_size": 2,
        "files": {"0": "step_000000000004/rank_0_of_2.pt", "1": "step_000000000004/rank_1_of_2.pt"},
    }
    assert (disk / manifest["files"]["1"]).read_bytes() == b"y" * 50
    assert not await anyio.Path(memory).exists()
    assert events.seen[-1] == ("aelastic.checkpoint.freed", {"bytes": 450})


async def test_unused_memory_is_freed_on_exit_without_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = Events()
    async with open_checkpoints("run/unused", _no_peers(), events) as cp:
        memory = cp.memory_dir
        assert os.path.isdir(memory)  # noqa: ASYNC240 (a thread would defeat the patch below)

        async def no_thread(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"thread hand-off at exit: {args}")

        monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    assert not os.path.exists(memory)  # noqa: ASYNC240
    assert events.seen == []  # nothing held, nothing freed to report


def test_release_if_empty_leaves_a_directory_with_steps_to_the_caller(tmp_path: Path) -> None:
    used, lock = claim(str(tmp_path), "used")
    try:
        commit(Path(used), 2, 0, 1)
        assert not release_if_empty(used)
        assert Path(used).is_dir()  # the caller removes the rest (it holds the lock's fd)
        # untouched: a sweep can still free it if this agent dies before its rmtree
        assert (Path(used) / ".owner").exists()
    finally:
        os.close(lock)
    empty, lock = claim(str(tmp_path), "empty")
    os.close(lock)
    assert release_if_empty(empty) and not Path(empty).exists()
    assert release_if_empty(empty)  # already gone: nothing left to free


def test_disk_step_not_whole_keeps_the_older_whole_one(tmp_path: Path) -> None:
    memory, disk = tmp_path / "mem", tmp_path / "disk"
    for rank in (0, 1):
        commit(memory, 2, rank, 2)
    write_step(str(memory), str(disk), 2, 2, [0, 1])
    commit(memory, 4, 0, 2)  # one node of a shared disk wrote its half of step 4
    write_step(str(memory), str(disk), 4, 2, [0])
    assert json.loads((disk / "manifest.json").read_text())["step"] == 2
    assert L.complete_steps(L.scan(str(disk)), (), whole_world=True) == {2: 2}


def test_memory_a_dead_agent_left_is_freed_and_a_live_ones_is_not(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", CLAIM_AND_DIE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    commit(Path(dead), 2, 0, 1)
    live, lock = claim(str(tmp_path), "job")
    try:
        unrelated = tmp_path / "aelastic_ckpt_not_an_agents"  # no owner file: left alone
        unrelated.mkdir()
        assert sweep_abandoned(str(tmp_path)) == [dead]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [Path(live).name, unrelated.name]
        )
    finally:
        os.close(lock)


CLAIM_AND_DIE = """\
import os, sys
from aelastic.checkpoint._owner import claim
print(claim(sys.argv[1], "job")[0], flush=True)
os._exit(0)  # as if SIGKILLed: nothing cleaned up
"""


@pytest.mark.parametrize("cut", ["membership change", "store closed"])
async def test_a_peer_that_never_publishes_does_not_hold_the_round(
    tmp_path: Path, cut: str
) -> None:
    commit(tmp_path, 4, 0, 2)
    node = Checkpoints(str(tmp_path), None, Events())
    changed, store = anyio.Event(), LocalStore()
    if cut == "membership change":
        changed.set()  # the peer died: the rendezvous saw its membership change
    else:
        store.close()  # the round's store went with its host
    with anyio.fail_after(10):
        env = await node.resume_env([0], store, 0, 2, changed.wait)
    assert env == {L.STEP_ENV: ""}
    assert sorted(L.scan(str(tmp_path))) == [4]  # kept for the next round to decide


@pytest.mark.parametrize("first", ["behind", "ahead"])
async def test_nodes_stopped_a_step_apart_leave_a_whole_step_on_disk(
    tmp_path: Path, first: str
) -> None:
    # A Slurm requeue SIGTERMs every process at once: node "behind" (ranks 0, 1) last
    # completed step 6, node "ahead" (ranks 2, 3) step 7. Each node's copy on exit must
    # leave step 6 whole on the shared disk, the newest step every rank holds.
    disk = tmp_path / "disk"
    held = {"behind": ((0, 1), (5, 6)), "ahead": ((2, 3), (6, 7))}
    order = [first, "ahead" if first == "behind" else "behind"]
    with anyio.fail_after(20):
        for node in order:
            ranks, steps = held[node]
            settings = _no_peers(dir=str(disk), persist_interval=3600)
            async with open_checkpoints(f"run-{node}", settings, Events()) as cp:
                cp.local_ranks = ranks
                for step in steps:
                    for rank in ranks:
                        commit(Path(cp.memory_dir), step, rank, 4, f"{step}:{rank}".encode())
    manifest = json.loads((disk / "manifest.json").read_text())
    assert (manifest["step"], manifest["world_size"]) == (6, 4)
    for rank in range(4):
        assert (disk / manifest["files"][str(rank)]).read_bytes() == f"6:{rank}".encode()
    assert L.complete_steps(L.scan(str(disk)), (), whole_world=True) == {6: 4}
