"""The health endpoint, queried with a real HTTP client (urllib, in a thread) on loopback."""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import socket
import sys
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from aelastic import LaunchConfig, open_job
from aelastic.health._settings import HealthSettings
from aelastic.progress._settings import HangSettings

from ._nodes import WORKER, cluster, free_port
from ._notify import workers_listener


def _get(address: tuple[str, int], path: str, method: str = "GET") -> tuple[int, str, str]:
    url = f"http://{address[0]}:{address[1]}{path}"
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["content-type"], exc.read().decode()


async def get(address: tuple[str, int], path: str, method: str = "GET") -> tuple[int, str, str]:
    return await anyio.to_thread.run_sync(_get, address, path, method)


def _config(**kw: Any) -> LaunchConfig:
    settings: dict[str, Any] = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": 2,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 2,
        "health": HealthSettings(port=0),
    }
    return LaunchConfig(**{**settings, **kw})


async def test_endpoint_answers_before_the_rendezvous_completes() -> None:
    config = _config(min_nodes=2, max_nodes=2)  # the second node never comes
    with anyio.fail_after(60):
        async with open_job(config, "/bin/true") as job:
            address = job.health_address
            assert address is not None and address[0] == "127.0.0.1" and address[1] > 0
            assert await get(address, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
            code, _, body = await get(address, "/readyz")
            assert (code, body) == (503, "not ready: INIT\n")
            code, kind, body = await get(address, "/status")
            status = json.loads(body)
            assert (code, kind) == (200, "application/json")
            assert status["state"] == "INIT" and status["run_id"] == job.run_id
            assert status["round"] is None and status["restarts_left"] == 2
            assert status["node"] == socket.gethostname() and status["role"] == "default_role"
            assert [w["pid"] for w in status["workers"]] == [None, None]
    with pytest.raises(OSError):  # closed with the job
        await get(address, "/healthz")


async def test_status_readiness_and_metrics_of_a_running_job() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with open_job(_config(), *w.argv("--wait")) as job:
                pids = await w.ready(2)
                async for change in job.state_changes():
                    if change.state.value == "HEALTHY":
                        break
                address = job.health_address
                assert address is not None
                assert (await get(address, "/readyz"))[:1] == (200,)
                status = json.loads((await get(address, "/status"))[2])
                assert status["state"] == "HEALTHY" and status["round"] is not None
                assert {x["local_rank"]: x["pid"] for x in status["workers"]} == pids
                assert sorted(x["global_rank"] for x in status["workers"]) == [0, 1]
                assert status["last_failure"] is None and status["restart_count"] == 0
                idle = status["idle_interpreters"]  # the warm pool: refilling or full
                assert idle["count"] in (0, 1, 2) and (idle["count"] == 0) == (
                    idle["rss_bytes"] == 0
                )
                code, kind, text = await get(address, "/metrics")
                assert code == 200 and kind.startswith("text/plain; version=0.0.4")
                labels = f'run_id="{job.run_id}",role="default_role"'
                assert f'aelastic_job_state{{{labels},state="HEALTHY"}} 1' in text
                assert f'aelastic_job_state{{{labels},state="INIT"}} 0' in text
                assert f"aelastic_job_workers_running{{{labels}}} 2" in text
                assert f"aelastic_job_restarts_left{{{labels}}} 2" in text
                assert "# TYPE aelastic_job_restarts_total counter" in text
                assert f"aelastic_goodput_ratio{{{labels}}} " in text
                assert "# TYPE aelastic_goodput_productive_seconds gauge" in text
                assert f'aelastic_goodput_badput_seconds{{{labels},category="startup"}} ' in text
                assert f'{{{labels},category="restart.crash"}} 0.0' in text
                assert (await get(address, "/nope"))[0] == 404
                assert (await get(address, "/status", "POST"))[0] == 405
                head = await get(address, "/status", "HEAD")
                assert head[:2] == (200, "application/json") and head[2] == ""
                await w.tell_all("exit 0")
                assert await job.wait() == {0: None, 1: None}


async def test_a_malformed_request_gets_400_and_the_endpoint_stays_up() -> None:
    with anyio.fail_after(60):
        async with open_job(_config(min_nodes=2, max_nodes=2), "/bin/true") as job:
            assert job.health_address is not None
            async with await anyio.connect_tcp(*job.health_address) as conn:
                await conn.send(b"NOT HTTP AT ALL\r\n\r\n")
                reply = b""
                try:
                    while True:
                        reply += await conn.receive()
                except anyio.EndOfStream:
                    pass
            assert reply.startswith(b"HTTP/1.1 400 ")
            assert (await get(job.health_address, "/healthz"))[0] == 200


async def test_cli_health_port_from_torchrun_variable(tmp_path: Path) -> None:
    port = free_port()
    argv = ["--standalone", "--nproc-per-node", "2", WORKER, str(tmp_path)]
    async with cluster() as c:
        node = await c.start(
            [*argv, "--finish-at-world", "9"],
            env={"TORCHELASTIC_HEALTH_CHECK_PORT": str(port)},
        )
        with anyio.fail_after(60):
            await node.wait_for_line(lambda line: line.startswith("READY"), count=2)
            status = json.loads((await get(("127.0.0.1", port), "/status"))[2])
            assert status["state"] == "HEALTHY" and len(status["workers"]) == 2
            assert all(isinstance(x["pid"], int) for x in status["workers"])
            node.process.send_signal(signal.SIGTERM)
            assert await node.wait() == 128 + signal.SIGTERM


def _serve_on(backend: str) -> tuple[int, dict[str, Any]]:
    """Serve a (not started) job's endpoint under ``backend``; query it over real HTTP."""
    from aelastic.health._server import serve_health

    async def main() -> tuple[int, dict[str, Any]]:
        async with anyio.create_task_group() as tg:
            address = await tg.start(serve_health, _idle_job(), "127.0.0.1", 0)
            code = (await get(address, "/healthz"))[0]
            status = json.loads((await get(address, "/status"))[2])
            tg.cancel_scope.cancel()
        return code, status

    return anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_endpoint_runs_on_every_anyio_backend(backend: str) -> None:
    pytest.importorskip(backend)
    code, status = await anyio.to_thread.run_sync(_serve_on, backend)
    assert code == 200 and status["state"] == "INIT" and len(status["workers"]) == 2


async def test_a_port_in_use_is_named_and_nothing_starts() -> None:
    from aelastic import AelasticError
    from aelastic.health._exceptions import HealthPortError

    async with await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0) as taken:
        port = taken.extra(anyio.abc.SocketAttribute.local_port)
        with pytest.raises(HealthPortError, match=f"cannot listen on 127.0.0.1:{port}") as info:
            async with open_job(_config(health=HealthSettings(port=port)), "/bin/true"):
                pytest.fail("the block must not run")
    error = info.value
    assert isinstance(error, AelasticError) and isinstance(error, OSError)
    assert error.errno == errno.EADDRINUSE and "--health-port" in str(error)


async def test_failure_summary_and_status_name_the_same_host() -> None:
    from aelastic.errors import ChildFailedError

    with anyio.fail_after(60):
        async with open_job(_config(max_restarts=0, nproc_per_node=1), "/bin/false") as job:
            assert job.health_address is not None
            with pytest.raises(ChildFailedError) as info:
                await job.wait()
            status = json.loads((await get(job.health_address, "/status"))[2])
    assert status["node"] == job.node
    assert f"  host      : {status['node']}\n" in str(info.value)


def _idle_job() -> Any:
    """A job that is made but not started: enough for the endpoint to report on."""
    from aelastic import Job
    from aelastic.launcher._build import prepare_job

    return Job(_config(), prepare_job(_config(), "/bin/true", ()))


async def _ask(host: str, port: int, conn: anyio.abc.SocketStream | None = None) -> bytes:
    """Send ``GET /healthz`` (on ``conn`` or a new connection); return the whole reply."""
    stream = conn if conn is not None else await anyio.connect_tcp(host, port)
    async with stream:
        await stream.send(b"GET /healthz HTTP/1.1\r\nhost: probe\r\n\r\n")
        reply = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                reply += await stream.receive()
    return reply


async def test_a_host_with_two_addresses_listens_on_one_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name resolving to 127.0.0.1 and ::1 (``localhost`` on many hosts): both listen on
    the reported port. No name here resolves to both, so the resolver is the seam."""
    from aelastic.health import _server

    async def both(host: str, port: int) -> list[str]:
        return ["127.0.0.1", "::1"]

    monkeypatch.setattr(_server, "_addresses", both)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(_server.serve_health, _idle_job(), "dual", 0)
            assert host == "127.0.0.1" and port > 0
            for address in ("127.0.0.1", "::1"):
                assert (await _ask(address, port)).startswith(b"HTTP/1.1 200 ")
            tg.cancel_scope.cancel()


async def test_connections_over_the_limit_are_closed_at_once() -> None:
    from aelastic.health._server import serve_health

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(
                partial(serve_health, max_connections=2), _idle_job(), "127.0.0.1", 0
            )
            conns = [await anyio.connect_tcp(host, port) for _ in range(3)]
            closed: list[int] = []
            async with anyio.create_task_group() as first_eof:

                async def until_closed(index: int) -> None:
                    with contextlib.suppress(anyio.EndOfStream):
                        await conns[index].receive()
                    closed.append(index)
                    first_eof.cancel_scope.cancel()

                for index in range(3):
                    first_eof.start_soon(until_closed, index)
            assert len(closed) == 1  # one closed with no answer, before any request timeout
            await conns[closed[0]].aclose()
            for index in {0, 1, 2} - set(closed):  # the two others are served
                assert (await _ask(host, port, conns[index])).startswith(b"HTTP/1.1 200 ")
            tg.cancel_scope.cancel()


async def test_status_and_metrics_show_the_last_hang(tmp_path: Path) -> None:
    async with workers_listener() as w:
        config = _config(
            log_dir=str(tmp_path), hangs=HangSettings(heartbeat_timeout=1.0), max_restarts=1
        )
        with anyio.fail_after(60):
            async with open_job(config, *w.argv("--hang-first")) as job:
                assert await job.wait() == {0: None, 1: None}
                address = job.health_address
                assert address is not None
                status = json.loads((await get(address, "/status"))[2])
                metrics = (await get(address, "/metrics"))[2]
    hang = status["last_hang"]
    assert status["hangs"] == 1 and hang is not None
    assert (hang["local_rank"], hang["global_rank"], hang["rule"]) == (0, 0, "heartbeat")
    assert hang["timeout"] == 1.0 and hang["section"] is None
    stacks = Path(hang["stacks_file"])
    assert stacks.is_relative_to(tmp_path) and stacks.parts[-3:] == ("attempt_0", "0", "stacks.txt")
    failure = status["last_failure"]  # the hung worker, once the agent stopped it
    assert failure is not None and failure["local_rank"] == 0 and failure["exitcode"] < 0
    labels = f'run_id="{job.run_id}",role="default_role"'
    assert f"aelastic_job_progress_hangs_total{{{labels}}} 1" in metrics
    assert f"aelastic_job_progress_stacks_captured_total{{{labels}}} {hang['stacks_captured']}" in (
        metrics
    )


async def test_metrics_show_the_heartbeat_age_of_running_workers() -> None:
    async with workers_listener() as w:
        config = _config(hangs=HangSettings(heartbeat_timeout=600.0))
        with anyio.fail_after(60):
            async with open_job(config, *w.argv("--hang-first")) as job:
                assert job.health_address is not None
                while (await w.line())[0] != "beat":
                    pass
                age = job.heartbeat_age_ms()
                assert age is not None and age >= 0
                metrics = (await get(job.health_address, "/metrics"))[2]
                assert "aelastic_job_progress_heartbeat_age_ms{" in metrics
                await w.tell_all("exit 0")
                assert await job.wait() == {0: None, 1: None}
                assert job.heartbeat_age_ms() is None  # no running worker beats
                metrics = (await get(job.health_address, "/metrics"))[2]
                assert "aelastic_job_progress_heartbeat_age_ms" not in metrics
                assert "aelastic_job_progress_learned_heartbeat_timeout_ms" not in metrics


async def test_metrics_show_the_learned_heartbeat_timeout(tmp_path: Path) -> None:
    """hang_worker's ``learn``: attempt 0 beats every 0.2 s and crashes, attempt 1 hangs
    and is caught by the learned (x5) timeout, attempt 2 succeeds."""
    worker = str(Path(__file__).parent.parent / "agent" / "scripts" / "hang_worker.py")
    config = _config(
        nproc_per_node=1,
        log_dir=str(tmp_path),
        hangs=HangSettings(heartbeat_timeout=30.0, learn_timeouts=5.0),
    )
    with anyio.fail_after(60):
        async with open_job(config, sys.executable, "-u", worker, "learn", "0") as job:
            assert await job.wait() == {0: None}
            assert job.health_address is not None
            metrics = (await get(job.health_address, "/metrics"))[2]
    learned = job.learned_heartbeat_timeout
    assert learned is not None and 5 * 0.2 <= learned < 30.0
    hang = job.last_hang
    assert hang is not None and hang.timeout == learned and job.hang_count == 1
    labels = f'run_id="{job.run_id}",role="default_role"'
    line = f"aelastic_job_progress_learned_heartbeat_timeout_ms{{{labels}}} {round(learned * 1000)}"
    assert line in metrics
