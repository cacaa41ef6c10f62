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
