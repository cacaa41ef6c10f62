"""Issue 40 item 11: a SIGKILLed agent's progress directory is freed by the next agent.

Real agents (``python -m aelastic run``) in their own processes, over a private root
(``AELASTIC_PROGRESS_ROOT``): nothing here looks at, or removes, anything in ``/dev/shm``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import PYTHON, sigkill_agent

WORKER = """\
import os, sys, threading
progress = os.environ["AELASTIC_PROGRESS_FILE"]
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(f"{os.path.dirname(progress)} {os.getpid()}")
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
if sys.argv[1] == "hold":
    threading.Event().wait()  # until the agent is killed (its parent-death signal)
"""

HOLD_A_DIRECTORY = """\
import sys
from aelastic.agent._hang import ProgressDirectory
d = ProgressDirectory()
print(d.name, flush=True)
sys.stdin.readline()
d.cleanup()
"""


def _agent(root: Path, tmp_path: Path, mode: str, report: Path) -> subprocess.Popen[bytes]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "AELASTIC_PROGRESS_ROOT": str(root)}
    run = [PYTHON, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "1"]
    return subprocess.Popen(
        [*run, "--max-restarts", "0", str(script), mode, str(report)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_a_killed_agents_progress_directory_is_freed_at_the_next_start(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    killed = _agent(root, tmp_path, "hold", tmp_path / "first")
    left, _ = sigkill_agent(killed, tmp_path / "first")
    assert Path(left).is_dir() and Path(left).parent == root  # SIGKILL: nothing cleaned up
    legacy = root / "aelastic_progress_made_without_an_owner"  # left alone: owner unknown
    legacy.mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_A_DIRECTORY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "AELASTIC_PROGRESS_ROOT": str(root)},
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        live = holder.stdout.readline().decode().strip()
        assert Path(live).is_dir()
        second = _agent(root, tmp_path, "exit", tmp_path / "second")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err.decode(errors="replace")
        assert not Path(left).exists()  # freed by the next agent
        assert "killed agents left behind" in err.decode(errors="replace")
        # the live owner's directory and the ownerless one stay; the second agent's is gone
        assert sorted(p.name for p in root.iterdir()) == sorted([Path(live).name, legacy.name])
        holder.stdin.write(b"\n")
        holder.stdin.flush()
    assert holder.returncode == 0
    assert [p.name for p in root.iterdir()] == [legacy.name]
