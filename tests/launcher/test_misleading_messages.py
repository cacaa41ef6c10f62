"""Messages that misled a newcomer (issue 31, item 12), checked with real runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from _ports import free_port  # tests/ is on sys.path

from aelastic.agent import LocalElasticAgent, SignalException, WorkerSpec
from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

ROOT = Path(__file__).resolve().parents[2]


def _aelastic_run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aelastic", "run", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def _summary_ranks(stderr: str) -> list[int]:
    return sorted(int(r) for r in re.findall(r"rank\s+: (\d+) \(local_rank", stderr))


def test_a_syntax_error_in_every_rank_lists_every_rank(tmp_path: Path) -> None:
    # Before: the summary advised a stderr log that does not exist (stderr went to the
    # console) and, in 2 of 7 runs, dropped the second rank (stopped before its exit
    # was collected). torchrun lists both.
    script = tmp_path / "bad.py"
    script.write_text("def f(:\n    pass\n")
    proc = _aelastic_run("--standalone", "--nproc-per-node", "2", str(script))
    assert proc.returncode == 1, proc.stderr
    assert "SyntaxError" in proc.stderr  # the workers' own stderr, on the console
    assert _summary_ranks(proc.stderr) == [0, 1], proc.stderr
    assert proc.stderr.count("exitcode  : 1 ") == 2
    assert "failed before its entry point ran (a syntax or import error" in proc.stderr
    assert "stderr log" not in proc.stderr and "Its stderr:" not in proc.stderr


def test_a_redirected_stderr_is_named_in_the_summary(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("import no_such_module_r31b\n")
    logs = tmp_path / "logs"
    argv = ["--standalone", "--nproc-per-node", "1", "--log-dir", str(logs), "-r", "2"]
    proc = _aelastic_run(*argv, str(script))
    assert proc.returncode == 1, proc.stderr
    named = re.findall(r"Its stderr: (\S+)", proc.stderr)
    assert len(named) == 1, proc.stderr
    assert "no_such_module_r31b" in Path(named[0]).read_text()


async def test_a_signal_before_any_worker_started_says_so(tmp_path: Path) -> None:
    params = RendezvousParameters("c10d", "127.0.0.1:0", "early", 1, 1, local_addr="127.0.0.1")
    spec = WorkerSpec(
        role="trainer",
        local_world_size=1,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=sys.executable,
        args=("-c", "pass"),
        log_dir=str(tmp_path),
    )
    agent = LocalElasticAgent(spec)
    agent.send_signal(signal.SIGTERM)  # before run(): the run stops at once
    with anyio.fail_after(60), pytest.raises(SignalException) as caught:
        await agent.run()
    assert not caught.value.workers_started
    assert "no worker had started yet" in str(caught.value)
    assert "workers were stopped" not in str(caught.value)


def _sigterm_before_any_worker(tmp_path: Path, rdzv: list[str], waiting: str) -> str:
    """Run a 2-node job of this node alone with ``rdzv`` flags; SIGTERM it once stderr
    says ``waiting``; return the rest of its stderr (it must exit 143, no worker run)."""
    script = tmp_path / "w.py"
    script.write_text("open('started', 'w').close()\n")
    argv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", *rdzv]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aelastic", "run", *argv, str(script)],
        env={**os.environ, "LOGLEVEL": "INFO"},
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if waiting in line:
                break
        else:
            pytest.fail(f"no line with {waiting!r}: " + "".join(seen))
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped by SIGTERM; no worker had started" in rest, rest
    assert "the workers were stopped" not in rest
    assert not (tmp_path / "started").exists()
    return rest


def test_cli_stopped_while_waiting_for_peers_says_no_worker_started(tmp_path: Path) -> None:
    # the agent is in the rendezvous, waiting for a peer
    rdzv = ["--rdzv-endpoint", "127.0.0.1:0", "--rdzv-conf", "join_timeout=120"]
    _sigterm_before_any_worker(tmp_path, rdzv, "rendezvous'ing worker group")


def test_cli_stopped_while_waiting_for_the_store_exits_at_once(tmp_path: Path) -> None:
    """SIGTERM while the node waits for a rendezvous store that is not up yet: it stops
    then (it used to ignore the signal until read_timeout, 60 s by default)."""
    port = free_port()  # a port nothing listens on
    rdzv = ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "late-store"]
    rdzv += ["--rdzv-conf", "is_host=0,read_timeout=300,wait_report_interval=0.2"]
    _sigterm_before_any_worker(tmp_path, rdzv, "to accept connections")


def test_checkpoint_save_outside_the_launcher_says_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AELASTIC_CHECKPOINT")}
    code = "import aelastic.checkpoint as c; c.save({'a': 1}, step=1)"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "aelastic.checkpoint.CheckpointError: aelastic.checkpoint.save needs the launcher: "
        "AELASTIC_CHECKPOINT_DIR is not set. Run the script under 'python -m aelastic run', "
        "whose agent keeps the memory the checkpoints live in"
    )


def test_run_help_lists_exit_code_95() -> None:
    proc = _aelastic_run("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for code in ("0 every worker", "1 the job failed", "93 stopped", "94 this node", "95 this"):
        assert code in text, code
    assert "95 this node was excluded (--exclude-node-after)" in text


def test_examples_crash_demo_uses_a_fresh_checkpoint_path() -> None:
    # A fixed /tmp path made a second run resume past the crash step instead of crashing.
    for path in (ROOT / "examples" / "README.md", ROOT / "examples" / "train_ddp.py"):
        lines = path.read_text().splitlines()
        demo = [line for line in lines if "--checkpoint" in line and "--crash-at-step" in line]
        assert demo, path
        for line in demo:
            assert '--checkpoint "$(mktemp -d)/' in line, (path, line)
