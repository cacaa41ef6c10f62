"""``python -m aelastic status`` against a live two-node c10d job that restarted once."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import anyio.to_thread
from launcher._nodes import free_port

from aelastic.jobview._keys import status_store

from ._live import (
    publish,
    status,
    status_follows_progress,
    status_json,
    two_nodes,
    write_stale_node,
)

DASHBOARD = [sys.executable, "-m", "aelastic", "dashboard"]


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


async def test_status_of_a_live_two_node_job_with_one_restart(tmp_path: Path) -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    flags = ("--rdzv-endpoint", endpoint, "--rdzv-id", "view-c10d")
    with anyio.fail_after(90):
        async with two_nodes(
            tmp_path, rdzv_backend="c10d", rdzv_endpoint=endpoint, run_id="view-c10d"
        ) as (w, jobs):
            await publish(jobs)
            view = await status_json(*flags)
            assert view["run_id"] == "view-c10d"
            nodes = view["nodes"]
            assert len(nodes) == 2
            assert len({n["node"] for n in nodes}) == 2  # unique per agent, one host
            assert {n["state"] for n in nodes} == {"HEALTHY"}
            assert {n["round"] for n in nodes} == {view["round"]}
            assert sorted(n["restart_count"] for n in nodes) == [0, 1]
            assert [n["group_rank"] for n in nodes] == [0, 1]
            ranks = sorted(w["global_rank"] for n in nodes for w in n["workers"])
            assert ranks == [0, 1]
            live = {w.pid for job in jobs for w in job.workers()}
            assert {w["pid"] for n in nodes for w in n["workers"]} == live
            assert all(w["step"] >= 5 for n in nodes for w in n["workers"])
            assert all(not n["stale"] for n in nodes)
            failed = next(n for n in nodes if n["restart_count"] == 1)
            assert failed["last_failure"]["exitcode"] == 3
            assert failed["last_failure"]["message"] == "exited 3"
            assert "restart" in [mark[1] for mark in failed["history"]["marks"]]

            # A node that stopped publishing two minutes ago shows as stale, with its age.
            found = status_store(jobs[0].status_publisher.handler)  # type: ignore[union-attr]
            assert found is not None
            await write_stale_node(found[0], nodes[0], "gone-host:1")
            view = await status_json(*flags)
            stale = [n for n in view["nodes"] if n["stale"]]
            assert [n["node"] for n in stale] == ["gone-host:1"]
            assert 110 < stale[0]["age_s"] < 200
            assert view["round"] == nodes[0]["round"]

            table = await status(*flags)
            assert table.returncode == 0, table.stderr.decode()
            lines = table.stdout.decode().splitlines()
            assert lines[0].startswith("run view-c10d: 3 nodes")
            assert lines[1].split()[:3] == ["NODE", "STATE", "ROUND"]
            assert any("HEALTHY (stale 1" in line and "gone-host:1" in line for line in lines)
            assert any("rank " in line and "exited 3" in line for line in lines)
            # the job's goodput: a column per node, the combined breakdown last
            assert "GOODPUT" in lines[1] and lines[-1].startswith("job goodput ")
            assert set(view["goodput"]) == {
                "wall_s", "productive_s", "ratio", "badput_s", "steps_kept", "steps_lost",
            }  # fmt: skip
            assert view["goodput"]["steps_kept"] > 0

            # The dashboard command serves the same view, on loopback, until SIGTERM.
            dashboard = await anyio.open_process([*DASHBOARD, *flags, "--port", "0"])
            async with dashboard:
                assert dashboard.stdout is not None
                line = (await dashboard.stdout.receive()).decode()
                assert line.startswith("aelastic dashboard: serving http://127.0.0.1:")
                url = line.split()[-1] + "view.json"
                served = json.loads(await anyio.to_thread.run_sync(_read, url))
                assert sorted(n["node"] for n in served["nodes"]) == sorted(
                    n["node"] for n in view["nodes"]
                )
                dashboard.send_signal(signal.SIGTERM)
                assert await dashboard.wait() == 0

            # The status follows the workers' steps, not a 5 s period (issue 40).
            await status_follows_progress(w, jobs)


async def test_a_wrong_run_id_or_endpoint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    with anyio.fail_after(60):
        async with two_nodes(
            tmp_path, rdzv_backend="c10d", rdzv_endpoint=endpoint, run_id="view-ids"
        ) as (_, jobs):
            await publish(jobs)
            wrong_id = await status("--rdzv-endpoint", endpoint, "--rdzv-id", "nope")
            unused = free_port()
            started = time.monotonic()
            wrong_port = await status(
                "--rdzv-endpoint", f"127.0.0.1:{unused}", "--rdzv-id", "view-ids",
                "--timeout", "2",
            )  # fmt: skip
    assert wrong_id.returncode == 2 and wrong_id.stdout == b""
    err = wrong_id.stderr.decode()
    assert err.count("\n") == 1 and "'nope'" in err and "--rdzv-id" in err
    assert wrong_port.returncode == 2 and time.monotonic() - started < 30
    err = wrong_port.stderr.decode()
    assert (
        err.count("\n") == 1 and f"cannot reach the rendezvous store at 127.0.0.1:{unused}" in err
    )
