"""An agent in its own process: SIGTERM or SIGKILL on it leaves no worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from .conftest import PYTHON, SCRIPTS, open_reporter, pid_alive

RUN_AGENT = str(SCRIPTS / "run_agent.py")


async def _start_agent(port: int, tmp_path: Path, mode: str = "hold") -> anyio.abc.Process:
    return await anyio.open_process(
        [PYTHON, RUN_AGENT, "--report", str(port), "--mode", mode, "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
async def test_forwarded_signal_stops_workers(tmp_path: Path, sig: signal.Signals) -> None:
    async with open_reporter() as rep:
        proc = await _start_agent(rep.port, tmp_path)
        try:
            reports = await rep.next(2)
            proc.send_signal(sig)
            with anyio.fail_after(30):
                code = await proc.wait()
            assert proc.stdout is not None
            out = (await proc.stdout.receive()).decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.aclose()
        assert code == 128 + int(sig), out
        assert f"agent-signal {sig.name}" in out
        # The agent reaped its workers before exiting.
        assert not any(pid_alive(r.pid) for r in reports)


async def test_sigkilled_agent_takes_its_workers_along(tmp_path: Path) -> None:
    async with open_reporter() as rep:
        proc = await _start_agent(rep.port, tmp_path)
        try:
            reports = await rep.next(2)
            proc.kill()
            with anyio.fail_after(30):
                await proc.wait()
                # PR_SET_PDEATHSIG: each worker dies, closing its reporter connection.
                for r in reports:
                    await r.wait_closed()
        finally:
            await proc.aclose()
        with anyio.fail_after(10):
            for r in reports:
                await _wait_pid_gone(r.pid)
        assert not any(pid_alive(r.pid) for r in reports)


async def _wait_pid_gone(pid: int) -> None:
    """Wait (pidfd readability: a real wait) until ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)
