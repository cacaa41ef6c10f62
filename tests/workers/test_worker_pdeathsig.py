"""A SIGKILLed agent leaves no worker behind (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import anyio
import pytest

from .conftest import Reporter, pid_gone, py, wait_gone

SCRIPT = os.path.join(os.path.dirname(__file__), "agent_script.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


async def test_worker_dies_with_sigkilled_agent(reporter: Reporter) -> None:
    # The worker ignores SIGTERM and SIGHUP: only the parent-death SIGKILL can end it.
    code = (
        "import signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "report(os.getpid())\n"
        "signal.pause()\n"
    )
    cfg = json.dumps({"argv": py(code)})
    async with await anyio.open_process(
        [sys.executable, SCRIPT, "hold", cfg],
        stdout=subprocess.PIPE,
        env=reporter.env(),
    ) as agent:
        worker = int(await reporter.receive())
        assert not pid_gone(worker)
        agent.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):
            assert await agent.wait() == -signal.SIGKILL
    await wait_gone(worker)
