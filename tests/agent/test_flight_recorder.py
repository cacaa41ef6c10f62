"""torch's flight recorder dumped by live workers on a hang (real gloo workers, real FIFOs).

torch records gloo collectives in its flight recorder too, so the CPU path is the
NCCL one minus the CUDA events: the same trigger, the same dump format.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic._stacks_dump import FR_FILE_ENV, FR_TRIGGER_ENV
from aelastic.agent import LocalElasticAgent, WorkerState, _flight_recorder
from aelastic.agent._flight_recorder import (
    dump_flight_recorder,
    flight_recorder_env,
    flight_recorder_files,
    torch_defaults,
)
from aelastic.agent._hang import remove_empty_files
from aelastic.agent._stacks import capture_stacks

from .conftest import SCRIPTS, LocalRendezvous, local_spec, run_until_event

pytest.importorskip("torch.distributed")


@pytest.fixture(autouse=True)
def _patient_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check what the worker answers, so the agent waits up to 20 s for it
    instead of its 3 s: on a loaded machine (two xdist workers) a worker without a process
    group once took longer to answer, the agent gave up, and its FIFO was still there."""
    monkeypatch.setattr(_flight_recorder, "FR_TIMEOUT", 20.0)


# A worker like the agent's: registers from its environment, runs `collectives` gloo
# all-reduces at world size 1 (0: no process group), says ready once its flight recorder
# thread waits on the FIFO (asked before, the agent finds no reader and leaves the FIFO:
# seen once in CI with no process group, where "ready" comes at once), then waits in a
# C call.
WORKER = """
import glob, os, sys, threading, time
from aelastic._stacks_dump import FR_TRIGGER_ENV, register_from_env
register_from_env()
def waiting_on_fifo():
    for path in glob.glob("/proc/self/task/*/wchan"):
        try:
            with open(path) as f:
                if f.read() == "wait_for_partner":
                    return True
        except OSError:
            pass
    return False
until = time.monotonic() + 30
while os.environ.get(FR_TRIGGER_ENV) and not waiting_on_fifo() and time.monotonic() < until:
    time.sleep(0.005)
n = int(sys.argv[1])
if n:
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    for _ in range(n):
        dist.all_reduce(torch.ones(8))
print("ready", flush=True)
threading.Event().wait()
"""


@contextmanager
def _worker(tmp_path: Path, collectives: int, *, asked: bool = True) -> Iterator[tuple[str, int]]:
    """A live worker: ``(its stacks file, its pid)`` (the trigger and dump sit beside it)."""
    stacks = str(tmp_path / "stacks.txt")
    env = {**os.environ, "RANK": "3", **(flight_recorder_env(stacks) if asked else {})}
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, str(collectives)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline() == "ready\n"
            yield stacks, proc.pid
        finally:
            proc.kill()
            remove_empty_files([stacks])


def _files(beside: str) -> list[str]:
    return sorted(os.listdir(os.path.dirname(beside)))


def _entries(path: str) -> list[dict[str, Any]]:
    with open(path, "rb") as fp:
        entries: list[dict[str, Any]] = pickle.load(fp)["entries"]
    return entries


def test_files_sit_next_to_the_stacks() -> None:
    assert flight_recorder_files("/r/attempt_0/1/stacks.txt") == (
        "/r/attempt_0/1/fr.fifo",
        "/r/attempt_0/1/nccl_trace_rank_",
    )
    assert flight_recorder_files("/p/attempt_0_1.stacks.txt") == (
        "/p/attempt_0_1.fr.fifo",
        "/p/attempt_0_1.nccl_trace_rank_",
    )


def test_torch_defaults_only_when_asked_and_never_over_the_users() -> None:
    asked = {FR_FILE_ENV: "/r/0/nccl_trace_rank_", FR_TRIGGER_ENV: "/r/0/fr.fifo"}
    assert torch_defaults({}) == {}
    assert torch_defaults(asked) == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": "/r/0/nccl_trace_rank_",
    }
    # Either name of each variable counts as the user's say (torch reads both).
    users = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/mine/trace_"}
    assert torch_defaults({**asked, **users}) == {}
    users = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "5", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/m/"}
    assert torch_defaults({**asked, **users}) == {}


async def test_a_hung_gloo_worker_writes_its_flight_recorder(tmp_path: Path) -> None:
    with _worker(tmp_path, 3) as (stacks, _pid):
        with anyio.fail_after(30):
            dump = await dump_flight_recorder(stacks)
        assert dump == str(tmp_path / "nccl_trace_rank_3")  # its RANK: torch's own name
        assert _files(stacks) == ["nccl_trace_rank_3"]  # the FIFO gone: the worker's "done"
        entries = _entries(dump)
        assert [e["profiling_name"] for e in entries] == ["gloo:all_reduce"] * 3
        assert entries[-1]["input_sizes"] == [[8]]
        # Asked once only: a second request finds no worker waiting and returns at once.
        assert await dump_flight_recorder(stacks) is None


async def test_no_process_group_no_dump_and_the_agent_does_not_wait(tmp_path: Path) -> None:
    with _worker(tmp_path, 0) as (stacks, _pid):
        with anyio.fail_after(30):
            assert await dump_flight_recorder(stacks) is None
        assert _files(stacks) == []  # FIFO removed, nothing dumped


async def test_a_worker_not_asked_is_skipped_at_once(tmp_path: Path) -> None:
    with _worker(tmp_path, 2, asked=False) as (stacks, _pid):
        with anyio.fail_after(1):  # no FIFO: ENOENT, no wait at all
            assert await dump_flight_recorder(stacks) is None
    stacks = str(tmp_path / "unread" / "stacks.txt")
    os.makedirs(os.path.dirname(stacks))
    flight_recorder_env(stacks)  # a FIFO nobody reads: ENXIO, no wait either
    with anyio.fail_after(1):
        assert await dump_flight_recorder(stacks) is None
    remove_empty_files([stacks])
    assert _files(stacks) == []


async def test_capture_stacks_writes_the_flight_recorder_too(tmp_path: Path) -> None:
    with _worker(tmp_path, 1) as (stacks, pid):
        with anyio.fail_after(30):
            await capture_stacks({0: (pid, stacks)})
        assert len(_entries(flight_recorder_files(stacks)[1] + "3")) == 1


ENV_WORKER = """
import json, os, sys
from aelastic.progress import heartbeat
heartbeat()
with open(os.path.join(sys.argv[1], os.environ["LOCAL_RANK"] + ".json"), "w") as fp:
    json.dump(dict(os.environ), fp)
"""

#: What torchrun users set for NCCL; each must reach the worker exactly as set.
NCCL_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "TORCH_NCCL_BLOCKING_WAIT": "1",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "17",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/mine_",
}


async def _worker_envs(tmp_path: Path) -> list[dict[str, str]]:
    """Each worker's environment after its first heartbeat, hang detection on."""
    script = tmp_path / "env_worker.py"
    script.write_text(ENV_WORKER)
    spec = local_spec(
        LocalRendezvous(),
        ("-u", str(script), str(tmp_path)),
        tmp_path,
        heartbeat_timeout=30.0,
        max_restarts=0,
    )
    with anyio.fail_after(60):
        result = await LocalElasticAgent(spec).run()
    assert result.state is WorkerState.SUCCEEDED
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]


async def test_nccl_variables_pass_through_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in NCCL_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_FR_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for env in await _worker_envs(tmp_path):
        assert {k: env.get(k) for k in NCCL_ENV} == NCCL_ENV
        # Their new names are not added either: torch would read those first.
        assert "TORCH_FR_DUMP_TEMP_FILE" not in env and "TORCH_FR_BUFFER_SIZE" not in env


async def test_flight_recorder_defaults_when_the_user_set_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*NCCL_ENV, "TORCH_FR_DUMP_TEMP_FILE", "TORCH_FR_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for rank, env in enumerate(await _worker_envs(tmp_path)):
        (run_dir,) = (tmp_path / "logs").glob("test-run_*")
        assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
        prefix = run_dir / "attempt_0" / str(rank) / "nccl_trace_rank_"
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(prefix)
        # Taken out by the worker at once: processes it starts do not inherit them.
        assert FR_TRIGGER_ENV not in env and FR_FILE_ENV not in env


async def test_a_hung_ddp_job_leaves_each_ranks_flight_recorder_beside_its_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 blocks in a real gloo all-reduce that rank 1 never joins: its dump shows
    that all-reduce; both dumps are named in the failures, next to the stacks."""
    for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    spec = local_spec(
        LocalRendezvous(),
        ("-u", str(SCRIPTS / "ddp_hang_worker.py")),
        tmp_path,
        initial_heartbeat_timeout=60.0,
        heartbeat_timeout=2.0,
        section_timeouts={"allreduce": 1.8},
        max_restarts=0,
    )
    with anyio.fail_after(90):
        result, _ = await run_until_event(LocalElasticAgent(spec), "aelastic.progress.hang")
    assert result.state is WorkerState.FAILED
    (run_dir,) = (tmp_path / "logs").glob("test-run_*")
    for rank in (0, 1):
        dump = run_dir / "attempt_0" / str(rank) / f"nccl_trace_rank_{rank}"
        assert f"torch's flight recorder: {dump}" in result.failures[rank].message
        assert not (dump.parent / "fr.fifo").exists()
        names = [e["profiling_name"] for e in _entries(str(dump))]
        assert names and set(names) == {"gloo:all_reduce"}
    # Rank 0 waits in the all-reduce of step 3: its last entry never completed.
    last = _entries(str(run_dir / "attempt_0" / "0" / "nccl_trace_rank_0"))[-1]
    assert last["state"] != "completed", last
