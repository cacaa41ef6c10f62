"""torch.distributed.checkpoint through the agent's memory: MemoryWriter and MemoryReader.

Real gloo jobs (one process per rank) with the environment the agent gives its workers,
and the agent's own code (``Checkpoints``) choosing the step to resume and writing it
to ``--checkpoint-dir``. The jobs that save run once per module (fixtures); the loads of
every test run in one 2-rank job, one load per test with that test's environment (a
fresh ``MemoryReader`` and state each), and each test reads its own lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from launcher._nodes import free_port  # tests/ is on sys.path

from aelastic.checkpoint import _layout as L
from aelastic.checkpoint._agent import Checkpoints
from aelastic.store import LocalStore

pytestmark = pytest.mark.timeout(450)  # jobs of 4 and 2 processes importing torch

SCRIPT = str(Path(__file__).parent / "scripts" / "dcp_job.py")


def gloo_job(world: int, env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    """Run ``world`` ranks of dcp_job.py; the JSON lines they printed, by rank."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, *args],
            env={
                **os.environ,
                **env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outs = [p.communicate(timeout=200) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    lines = [json.loads(line) for out, _ in outs for line in out.splitlines() if line]
    return sorted(lines, key=lambda line: int(line["rank"]))


def _split(saved: Path, a: Path, b: Path) -> None:
    """The newest step of ``saved``: ranks 0, 1 and ``.metadata`` into ``a``, 2 and 3 into ``b``."""
    step = max(L.scan(str(saved)))
    for node, ranks in ((a, (0, 1)), (b, (2, 3))):
        for rank in ranks:
            source = Path(L.rank_file(str(saved), step, rank, 4))
            target = Path(L.rank_file(str(node), step, rank, 4))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    metadata = Path(L.step_dir(str(saved), step), L.METADATA)
    Path(L.step_dir(str(a), step), L.METADATA).write_bytes(metadata.read_bytes())


async def after_node_a_left(saved: Path, tmp: Path) -> dict[str, str]:
    """Two nodes of 2 ranks held a 4-rank DCP job's newest step without a shared
    ``--checkpoint-dir``: node a ranks 0 and 1 and the ``.metadata`` (DCP's coordinator is
    rank 0), node b ranks 2 and 3. Node a pushed its copy to b (``--checkpoint-peer-copies``),
    then left; b's two workers resume as ranks 0 and 1 of 2. What b's agent gives them."""
    from aelastic.checkpoint._peer_copies import PeerRound, open_peer_copies

    a, b = tmp / "node_a", tmp / "node_b"
    _split(saved, a, b)
    store = LocalStore()
    async with open_peer_copies(str(a), 1, 3600) as ra, open_peer_copies(str(b), 1, 3600) as rb:
        rounds = [PeerRound(store, g, 2, ranks, "127.0.0.1", "127.0.0.1") for g, ranks in
                  ((0, (0, 1)), (1, (2, 3)))]  # fmt: skip
        async with anyio.create_task_group() as tg:
            tg.start_soon(ra.join, rounds[0])
            tg.start_soon(rb.join, rounds[1])
        ra.started(rounds[0])
        await ra.push()
    return await resume_env(b, None, [0, 1])


async def after_node_a_left_of_three(saved: Path, tmp: Path) -> dict[str, dict[str, str]]:
    """Three nodes held a 4-rank DCP job's newest step, one copy each on the ring
    (issue 36): node a ranks 0, 1, the ``.metadata`` and c's copy; b rank 2 and a's
    copy (with the metadata, as a's push carries it); c rank 3 and b's copy. Node a left;
    b and c resume as ranks 0 and 1 of 2. Neither holds every file DCP may read (it
    writes a replicated item once, in one rank's file): each fetches what it lacks from
    the other. What each agent gives its worker, by node."""
    from aelastic.checkpoint._peer_copies import open_peer_copies

    nodes = _ring_of_three(saved, tmp)
    store = LocalStore()
    envs: dict[str, dict[str, str]] = {}
    async with (
        open_peer_copies(str(nodes["b"]), 1, 3600) as rb,
        open_peer_copies(str(nodes["c"]), 1, 3600) as rc,
    ):

        async def resume(name: str, group_rank: int, peers: Any) -> None:
            cp = Checkpoints(str(nodes[name]), None, lambda n, md: None, peers)
            address = ("127.0.0.1", "127.0.0.1")
            env = await cp.resume_env([group_rank], store, group_rank, 2, address=address)
            envs[name] = {**cp.env(), **env}

        async with anyio.create_task_group() as tg:
            tg.start_soon(resume, "b", 0, rb)
            tg.start_soon(resume, "c", 1, rc)
    return envs


def _ring_of_three(saved: Path, tmp: Path) -> dict[str, Path]:
    """The newest step of ``saved`` laid out on nodes a, b, c as described above."""
    step = max(L.scan(str(saved)))
    nodes = {n: tmp / f"three_{n}" for n in "abc"}
    held = {"a": (0, 1, 3), "b": (2, 0, 1), "c": (3, 2)}
    metadata = Path(L.step_dir(str(saved), step), L.METADATA).read_bytes()
    for name, ranks in held.items():
        for rank in ranks:
            target = Path(L.rank_file(str(nodes[name]), step, rank, 4))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(Path(L.rank_file(str(saved), step, rank, 4)).read_bytes())
        if name in "ab":
            Path(L.step_dir(str(nodes[name]), step), L.METADATA).write_bytes(metadata)
    return nodes


async def resume_env(memory: Path, disk: Path | None, ranks: list[int]) -> dict[str, str]:
    """What the agent gives a round of ``ranks`` (one node): its own choice of the step."""
    cp = Checkpoints(str(memory), None if disk is None else str(disk), lambda n, md: None)
    return {**cp.env(), **await cp.resume_env(ranks, LocalStore(), 0, 1)}


MODES = {"save": (), "async_save": ("--async",)}


@pytest.fixture(scope="module")
def saved_by_4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Memory of a 4-rank job that saved steps 1..3 through MemoryWriter, by mode."""
    memories = {}
    for name, mode in MODES.items():
        memory = tmp_path_factory.mktemp(name) / "shm"
        memory.mkdir()
        gloo_job(4, {L.DIR_ENV: str(memory)}, "save", "--steps", "3", *mode)
        memories[name] = memory
    return memories


@pytest.fixture(scope="module")
def persisted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--checkpoint-dir`` after a 2-rank job saved steps 1 and 2 through MemoryWriter
    and the agent wrote its newest step there."""
    tmp = tmp_path_factory.mktemp("persisted")
    memory, disk = tmp / "shm", tmp / "disk"
    memory.mkdir()
    gloo_job(2, {L.DIR_ENV: str(memory)}, "save", "--steps", "2")

    async def persist() -> None:  # what the agent does every interval and at its exit
        cp = Checkpoints(str(memory), str(disk), lambda n, md: None)
        cp.local_ranks = (0, 1)
        await cp.persist()

    anyio.run(persist)
    return disk


@pytest.fixture(scope="module")
def loads(
    tmp_path_factory: pytest.TempPathFactory, saved_by_4: dict[str, Path], persisted: Path
) -> dict[str, tuple[dict[str, str], list[dict[str, Any]]]]:
    """Label -> (the environment, the lines by rank) of each test's load, all loaded by
    the ranks of one 2-rank job."""
    tmp = tmp_path_factory.mktemp("loads")
    empty = tmp / "empty"
    empty.mkdir()
    cases = {
        # two ranks are left (a node with half the ranks went away): the agent resumes them
        **{
            name: anyio.run(resume_env, memory, None, [0, 1]) for name, memory in saved_by_4.items()
        },
        "node_a_left": anyio.run(after_node_a_left, saved_by_4["save"], tmp),
        **{
            f"three_{name}": env
            for name, env in anyio.run(after_node_a_left_of_three, saved_by_4["save"], tmp).items()
        },
        "no_checkpoint": {L.DIR_ENV: str(tmp / "nothing")},
        # nothing in memory: the agent finds the step on disk, MemoryReader reads it there
        "fresh_launch": anyio.run(resume_env, empty, persisted, [0, 1]),
    }
    (tmp / "nothing").mkdir()
    (tmp / "cases.json").write_text(json.dumps(cases))
    lines = gloo_job(2, {}, "load", "--cases", str(tmp / "cases.json"))
    assert [line["case"] for line in lines] == [*cases] * 2  # every load, on both ranks
    return {
        label: (
            env,
            [{k: v for k, v in ln.items() if k != "case"} for ln in lines if ln["case"] == label],
        )
        for label, env in cases.items()
    }


@pytest.mark.parametrize("mode", [*MODES])
def test_dcp_state_saved_by_4_ranks_loads_resharded_into_2(
    saved_by_4: dict[str, Path],
    loads: dict[str, tuple[dict[str, str], list[dict[str, Any]]]],
    mode: str,
) -> None:
    memory = saved_by_4[mode]
    held = L.scan(str(memory))
    assert sorted(held) == [2, 3]  # two steps kept, every rank's file of each
    assert all(
        dict(s.ranks) == {4: dict(s.ranks[4])} and len(s.ranks[4]) == 4 for s in held.values()
    )
    assert (memory / "step_000000000003" / L.METADATA).is_file()
    assert not (memory / "step_000000000001").exists()  # reused, not left behind

    env, lines = loads[mode]
    assert (env[L.STEP_ENV], env[L.WORLD_ENV]) == ("3", "4")
    assert lines == [{"rank": r, "step": 3, "same": True, "saved": 3} for r in (0, 1)]


def test_without_a_shared_dir_the_peer_copy_carries_the_dcp_metadata(
    loads: dict[str, tuple[dict[str, str], list[dict[str, Any]]]],
) -> None:
    # node b holds only its own ranks' files and a's copy: the step's .metadata came
    # with it, and the 4-rank state loads resharded into b's 2 ranks
    env, lines = loads["node_a_left"]
    b = Path(env[L.DIR_ENV])
    assert (b / "step_000000000003" / L.METADATA).is_file()
    assert (env[L.STEP_ENV], env[L.WORLD_ENV]) == ("3", "4")
    assert lines == [{"rank": r, "step": 3, "same": True, "saved": 3} for r in (0, 1)]


@pytest.mark.parametrize("node", ["b", "c"])
def test_three_nodes_without_a_shared_dir_fetch_the_whole_dcp_step(
    loads: dict[str, tuple[dict[str, str], list[dict[str, Any]]]], node: str
) -> None:
    # each survivor's memory holds every rank file of step 3 and its metadata once the
    # round started (c had 2 of the 4 files and no metadata), and the state loads
    env, lines = loads[f"three_{node}"]
    assert (env[L.STEP_ENV], env[L.WORLD_ENV]) == ("3", "4")
    memory = env[L.DIR_ENV]
    assert sorted(L.scan(memory)[3].ranks[4]) == [0, 1, 2, 3]
    assert (Path(L.step_dir(memory, 3)) / L.METADATA).is_file()
    assert lines == [{"rank": r, "step": 3, "same": True, "saved": 3} for r in (0, 1)]


def test_no_checkpoint_reads_as_step_none(
    loads: dict[str, tuple[dict[str, str], list[dict[str, Any]]]],
) -> None:
    assert [line["step"] for line in loads["no_checkpoint"][1]] == [None, None]


PLAIN_LOAD = """\
import json, sys, torch, torch.distributed.checkpoint as dcp
manifest = json.load(open(sys.argv[1] + "/manifest.json"))
state = {"w": torch.zeros(16, 4), "step": 0}
dcp.load(state, checkpoint_id=sys.argv[1] + "/" + manifest["dir"])
full = torch.arange(64, dtype=torch.float32).reshape(16, 4)
print(json.dumps({"step": state["step"], "same": torch.equal(state["w"], full * state["step"]),
                  "dcp": manifest["dcp"], "manifest_step": manifest["step"],
                  "aelastic": any(m.startswith("aelastic") for m in sys.modules)}))
"""


def test_persisted_dcp_step_loads_with_plain_dcp_load(persisted: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_LOAD, str(persisted)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out == {"step": 2, "same": True, "dcp": True, "manifest_step": 2, "aelastic": False}


def test_fresh_launch_resumes_from_the_persisted_dcp_step(
    loads: dict[str, tuple[dict[str, str], list[dict[str, Any]]]],
) -> None:
    lines = loads["fresh_launch"][1]
    assert lines == [{"rank": r, "step": 2, "same": True, "saved": 2} for r in (0, 1)]
