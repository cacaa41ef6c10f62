"""A SIGKILLed agent leaves no worker behind (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.workers import ProcessSpec, open_worker_processes
from aelastic.workers._pdeathsig import pdeathsig_mode, wrap_argv

from .conftest import Reporter, pid_gone, py, wait_gone

SCRIPT = os.path.join(os.path.dirname(__file__), "agent_script.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


@pytest.mark.parametrize(
    ("backend", "mode"),
    [("asyncio", "wrapper"), ("asyncio", "preexec"), ("uvloop", "wrapper"), ("trio", "wrapper")],
    ids=["asyncio-setpriv", "asyncio-preexec", "uvloop-setpriv", "trio-setpriv"],
)
async def test_worker_dies_with_sigkilled_agent(
    reporter: Reporter, backend: str, mode: str
) -> None:
    if backend != "asyncio":
        pytest.importorskip(backend)
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
    cfg = json.dumps({"argv": py(code), "backend": backend})
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


@pytest.mark.parametrize(
    "extra",
    [{}, {"PWD": "/not/the/cwd"}, {"A.B": "odd name", "IFS": "x"}],
    ids=["no-pwd", "odd-pwd", "names-dash-would-drop"],
)
@pytest.mark.anyio
async def test_worker_environment_arrives_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, str]
) -> None:
    monkeypatch.delenv("AELASTIC_PDEATHSIG", raising=False)
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_CTYPE": "C.UTF-8", "SP": "a b\nc"}
    env.update(EMPTY="", **extra)
    out = str(tmp_path / "env.json")
    code = "import json, os, sys\nprint(json.dumps(dict(os.environ)))"
    specs = [ProcessSpec(0, [sys.executable, "-c", code], env, stdout_file=out)]
    async with open_worker_processes(specs) as workers:
        with anyio.fail_after(20):
            assert (await workers.wait_for_exit()).exitcode == 0
    assert json.loads(await anyio.Path(out).read_text()) == env


# The shell prints its own argv from /proc (not $0, which `sh -c` takes from its operands)
# and then its environment.
SHOW_ARGV = 'tr "\\0" "\\n" < /proc/$$/cmdline; echo ---; env | sort'


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["wrapper", "preexec", "off"])
@pytest.mark.parametrize("with_path", [True, False], ids=["PATH", "no-PATH"])
async def test_argv0_on_path_reaches_the_worker_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, with_path: bool
) -> None:
    """Issue 10 item 6: ``--no-python sh ...`` must give the worker argv[0] ``sh``, not
    ``/usr/bin/sh``, and the environment and program ``Popen(argv, env=env)`` gives it."""
    monkeypatch.setenv("AELASTIC_PDEATHSIG", mode)
    if mode == "wrapper" and pdeathsig_mode() != "wrapper":
        pytest.skip("util-linux setpriv with --pdeathsig is not installed")
    env = {"LC_ALL": "C"}
    if with_path:
        env["PATH"] = os.environ.get("PATH", os.defpath)
    argv = ["sh", "-c", SHOW_ARGV, "zero"]
    with anyio.fail_after(30):
        reference = await anyio.run_process(argv, env=env)
    out = tmp_path / "out"
    async with open_worker_processes([ProcessSpec(0, argv, env, stdout_file=str(out))]) as w:
        with anyio.fail_after(20):
            assert (await w.wait_for_exit()).exitcode == 0
    seen = out.read_bytes()
    assert seen == reference.stdout
    assert seen.split(b"\n")[:4] == [b"sh", b"-c", SHOW_ARGV.encode(), b"zero"]
    assert (b"\nPATH=" in seen) is with_path
