"""A SIGKILLed agent leaves no worker behind (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import anyio
import pytest

from aelastic.workers._pdeathsig import pdeathsig_mode, wrap_argv

from .conftest import Reporter, pid_gone, py, wait_gone

SCRIPT = os.path.join(os.path.dirname(__file__), "agent_script.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


@pytest.mark.parametrize(
    ("uvloop", "mode"),
    [(False, "wrapper"), (False, "preexec"), (True, "wrapper")],
    ids=["asyncio-setpriv", "asyncio-preexec", "uvloop-setpriv"],
)
async def test_worker_dies_with_sigkilled_agent(
    reporter: Reporter, uvloop: bool, mode: str
) -> None:
    if uvloop:
        pytest.importorskip("uvloop")
    if mode == "wrapper" and pdeathsig_mode() != "wrapper":
        pytest.skip("util-linux setpriv with --pdeathsig is not installed")
    # The worker ignores SIGTERM and SIGHUP: only the parent-death SIGKILL can end it.
    code = (
        "import signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "report(os.getpid())\n"
        "signal.pause()\n"
    )
    cfg = json.dumps({"argv": py(code), "uvloop": uvloop})
    async with await anyio.open_process(
        [sys.executable, SCRIPT, "hold", cfg],
        stdout=subprocess.PIPE,
        env=reporter.env(AELASTIC_PDEATHSIG=mode),
    ) as agent:
        worker = int(await reporter.receive())
        assert not pid_gone(worker)
        agent.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):
            assert await agent.wait() == -signal.SIGKILL
    await wait_gone(worker)


def test_guard_kills_a_child_whose_agent_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Started by an intermediate shell instead of this process, the wrapped child
    # sees a parent other than the agent: as if the agent died before setpriv ran.
    monkeypatch.delenv("AELASTIC_PDEATHSIG", raising=False)
    if pdeathsig_mode() != "wrapper":
        pytest.skip("util-linux setpriv with --pdeathsig is not installed")
    argv, preexec = wrap_argv(["echo", "escaped"], os.environ, None)
    assert preexec is None
    done = subprocess.run(
        ["/bin/sh", "-c", '"$@"; echo "rc=$?"', "sh", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.stdout.strip() == f"rc={128 + signal.SIGKILL}"


def test_mode_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AELASTIC_PDEATHSIG", "sometimes")
    with pytest.raises(ValueError, match="wrapper, preexec, off"):
        pdeathsig_mode()
    monkeypatch.setenv("AELASTIC_PDEATHSIG", "off")
    assert wrap_argv(["true"], os.environ, None) == (["true"], None)
