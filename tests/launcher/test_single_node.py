"""``aelastic run`` as a subprocess on one node, and ``launch()`` in-process (non-torch workers)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest

from aelastic import LaunchConfig, elastic_launch, launch
from aelastic.errors import ChildFailedError

from ._nodes import WORKER, cluster, records


async def test_standalone_two_workers_get_the_env_contract(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                WORKER,
                str(tmp_path),
                "--tag",
                "${local_rank}",
            ]
        )
        with anyio.fail_after(60):
            assert await node.wait() == 0, node.err
    recs = sorted(records(tmp_path), key=lambda r: r["RANK"])
    assert [r["RANK"] for r in recs] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in recs} == {"2"}
    assert [r["tag"] for r in recs] == ["0", "1"]  # the ${local_rank} macro
    assert {r["OMP_NUM_THREADS"] for r in recs} == {"1"}  # torchrun's rule, nproc > 1
    assert {r["TORCHELASTIC_SIGNALS_TO_HANDLE"] for r in recs} == {"SIGTERM,SIGINT,SIGHUP,SIGQUIT"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert "OMP_NUM_THREADS" in node.err  # the warning


async def test_pet_environment_drives_the_launch(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            [WORKER, str(tmp_path)],
            env={"PET_NPROC_PER_NODE": "3", "PET_STANDALONE": "1", "PET_ROLE": "trainer"},
        )
        with anyio.fail_after(60):
            assert await node.wait() == 0, node.err
    recs = records(tmp_path)
    assert sorted(r["RANK"] for r in recs) == ["0", "1", "2"]
    assert {r["ROLE_NAME"] for r in recs} == {"trainer"}


async def test_failure_prints_the_summary_without_traceback(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            ["--standalone", "--nproc-per-node", "2", WORKER, str(tmp_path), "--exit-code", "7"]
        )
        with anyio.fail_after(60):
            assert await node.wait() == 1
    assert "node_worker.py FAILED" in node.err
    assert "exitcode  : 7" in node.err
    assert "Root Cause" in node.err
    assert "Traceback" not in node.err


async def test_restart_budget_is_spent_then_the_job_fails(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            ["--standalone", "--max-restarts", "2", WORKER, str(tmp_path), "--exit-code", "1"]
        )
        with anyio.fail_after(60):
            assert await node.wait() == 1
    counts = sorted(r["TORCHELASTIC_RESTART_COUNT"] for r in records(tmp_path))
    assert counts == ["0", "1", "2"]


async def test_sigterm_is_forwarded_and_sets_the_exit_code(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                WORKER,
                str(tmp_path),
                "--finish-at-world",
                "9",
            ]
        )
        with anyio.fail_after(60):
            await node.wait_for_line(lambda line: line.startswith("READY"), count=2)
            node.process.send_signal(signal.SIGTERM)
            assert await node.wait() == 128 + signal.SIGTERM
    assert "SIGTERM" in node.err and "Traceback" not in node.err


def _config(nproc: int = 2) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
    )


async def test_two_launches_in_one_event_loop(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    results: dict[str, dict[int, object]] = {}

    async def one(name: str, out: Path, nproc: int) -> None:
        results[name] = await launch(_config(nproc), sys.executable, "-u", WORKER, str(out))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a", a, 2)
            tg.start_soon(one, "b", b, 3)
    assert results == {"a": {0: None, 1: None}, "b": {0: None, 1: None, 2: None}}
    assert len({r["TORCHELASTIC_RUN_ID"] for r in records(a) + records(b)}) == 2
    assert {r["TORCHELASTIC_SIGNALS_TO_HANDLE"] for r in records(a)} == {
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    }


async def test_launch_raises_child_failed_error(tmp_path: Path) -> None:
    with anyio.fail_after(60), pytest.raises(ChildFailedError) as info:
        await launch(_config(1), sys.executable, "-u", WORKER, str(tmp_path), "--exit-code", "3")
    rank, failure = info.value.get_first_failure()
    assert rank == 0 and failure.exitcode == 3


async def test_elastic_launch_refuses_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match=r"await aelastic\.launch"):
        elastic_launch(_config(1), sys.executable)()


async def test_elastic_launch_runs_its_own_loop_for_sync_callers(tmp_path: Path) -> None:
    run = elastic_launch(_config(2), sys.executable)
    with anyio.fail_after(60):
        result = await anyio.to_thread.run_sync(run, "-u", WORKER, str(tmp_path))
    assert result == {0: None, 1: None}


async def test_launch_a_callable_returns_values_by_global_rank() -> None:
    import operator

    with anyio.fail_after(60):
        result = await launch(_config(2), operator.add, 20, 22)
    assert result == {0: 42, 1: 42}


async def test_log_dir_redirects_tee_and_local_ranks_filter(tmp_path: Path) -> None:
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    argv = ["--standalone", "--nproc-per-node", "2", "--log-dir", str(logs), "--tee", "1"]
    argv += ["--local-ranks-filter", "1", WORKER, str(out)]
    async with cluster() as c:
        node = await c.start(argv)
        with anyio.fail_after(60):
            assert await node.wait() == 0, node.err
    # the console shows local rank 1 only; both ranks' stdout is in their files
    assert [line for line in node.lines if "READY" in line] == [
        next(line for line in node.lines if "READY rank=1" in line)
    ]
    files = sorted(logs.rglob("stdout.log"))
    assert len(files) == 2
    assert sorted(f.read_text().strip().split()[-2] for f in files) == ["rank=0", "rank=1"]


async def test_log_dir_devnull_disables_files(tmp_path: Path) -> None:
    argv = ["--standalone", "--log-dir", "/dev/null", "-r", "3", WORKER, str(tmp_path)]
    async with cluster() as c:
        node = await c.start(argv)
        with anyio.fail_after(60):
            assert await node.wait() == 0, node.err
    (rec,) = records(tmp_path)
    assert rec["TORCHELASTIC_ERROR_FILE"] == ""
    # torchrun's rule: no files, so no redirect either; the line reaches the console as is
    assert [line.strip() for line in node.lines if "READY" in line] == ["READY rank=0 world=1"]


async def test_default_log_dir_gives_workers_an_error_file(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(["--standalone", WORKER, str(tmp_path)])
        with anyio.fail_after(60):
            assert await node.wait() == 0, node.err
    (rec,) = records(tmp_path)
    assert rec["TORCHELASTIC_ERROR_FILE"].endswith("error.json")


def test_the_agent_process_never_imports_torch(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys\n"
        "from aelastic.launcher._cli import main\n"
        f"rc = main(['--standalone', {WORKER!r}, {str(tmp_path)!r}])\n"
        "assert rc == 0, rc\n"
        "assert 'torch' not in sys.modules\n"
        "print('NO_TORCH')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert "NO_TORCH" in proc.stdout, proc.stderr


async def test_virtual_local_rank(tmp_path: Path) -> None:
    argv = ["--standalone", "--nproc-per-node", "2", "--virtual-local-rank", WORKER, str(tmp_path)]
    async with cluster() as c:
        node = await c.start(argv, env={"CUDA_VISIBLE_DEVICES": "4,6"})
        with anyio.fail_after(60):
            assert await node.wait() == 0, node.err
    recs = sorted(records(tmp_path), key=lambda r: r["RANK"])
    assert [(r["RANK"], r["LOCAL_RANK"], r["CUDA_VISIBLE_DEVICES"]) for r in recs] == [
        ("0", "0", "4"),
        ("1", "0", "6"),
    ]


async def test_cancelling_launch_stops_the_workers(tmp_path: Path) -> None:
    import os

    config = _config(2)
    config.shutdown_timeout = 5
    pids: list[int] = []
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as multi:
        listener = multi.listeners[0]
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    launch,
                    config,
                    sys.executable,
                    "-u",
                    WORKER,
                    str(tmp_path),
                    "--finish-at-world",
                    "9",
                    "--notify",
                    str(port),
                )
                while len(pids) < 2:  # both workers are running
                    async with await listener.accept() as conn:
                        pids.append(int((await conn.receive()).decode().strip()))
                tg.cancel_scope.cancel()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
