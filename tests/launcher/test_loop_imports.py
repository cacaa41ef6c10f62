"""The first job of a service imports the agent's modules off its event loop (issue 20)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).parent / "scripts" / "loop_imports.py")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_first_open_job_imports_nothing_on_the_loop(backend: str) -> None:
    """A fresh interpreter runs one job with open_job; no aelastic module is imported
    on the loop's thread once the service runs (they are imported in a worker thread)."""
    done = subprocess.run(
        [sys.executable, SCRIPT, backend], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_cli_imports_the_jobs_modules_before_its_loop(tmp_path: Path) -> None:
    """``aelastic run`` imports every module its job needs before the event loop starts,
    so the job finds nothing left to import in a thread (a thread's start and hand-offs
    would sit on the way to the workers' start)."""
    noop = tmp_path / "noop.py"
    noop.write_text("pass\n")
    script = str(Path(__file__).parent / "scripts" / "cli_imports.py")
    done = subprocess.run(
        [sys.executable, script, str(noop)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    main_thread, other_threads = json.loads(done.stdout.splitlines()[-1])
    assert "aelastic.nodes._gate" in main_thread
    assert other_threads == []
