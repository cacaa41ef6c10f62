"""``--preload``'s directory (``<temp dir>/aelastic-preload-*``) never outlives its agent
for long: a SIGKILLed agent's is freed by the next ``--preload`` agent, a live agent's
and an ownerless one stay, and every exit the pool sees (an error, cancellation)
removes its own.

Real agents (``python -m aelastic run``) in their own processes, each with ``TMPDIR``
pointing at this test's private directory: nothing outside it is looked at or removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.workers._warm import open_warm_pool

from .conftest import PYTHON, sigkill_agent

WORKER = """\
import os, sys, threading
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
if sys.argv[1] == "hold":
    threading.Event().wait()  # until the agent is killed (its parent-death signal)
"""

HOLD_A_PLAN = """\
import sys
from aelastic.workers._preload import PreloadPlan
plan = PreloadPlan(["colorsys"])
print(plan.dir, flush=True)
sys.stdin.readline()
plan.close()
"""


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp)}


def _agent(tmp: Path, tmp_path: Path, mode: str, report: Path) -> subprocess.Popen[bytes]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = [PYTHON, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "1"]
    flags = ["--max-restarts", "0", "--preload", "colorsys", "--log-dir", str(tmp_path / "logs")]
    return subprocess.Popen(
        [*run, *flags, str(script), mode, str(report)],
        env=_env(tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _preload_dirs(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("aelastic-preload-"))


def test_a_killed_agents_preload_directory_is_freed_by_the_next_agent(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed = _agent(tmp, tmp_path, "hold", tmp_path / "first")
    sigkill_agent(killed, tmp_path / "first")
    (left,) = _preload_dirs(tmp)  # the killed agent's, with its owner file
    assert (tmp / left / ".owner").is_file() and (tmp / left / "learned").is_dir()
    assert _preload_dirs(tmp) == [left]  # SIGKILL: nothing cleaned up
    legacy = tmp / "aelastic-preload-made_without_an_owner"  # left alone: owner unknown
    legacy.mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_A_PLAN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_env(tmp),
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        live = Path(holder.stdout.readline().decode().strip())
        assert live.is_dir() and live.parent == tmp
        second = _agent(tmp, tmp_path, "exit", tmp_path / "second")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err.decode(errors="replace")
        assert "preload directories that killed agents left behind" in err.decode()
        # the killed agent's is gone; the live owner's and the ownerless one stay; the
        # second agent removed its own on its way out
        assert _preload_dirs(tmp) == sorted([live.name, legacy.name])
        holder.stdin.write(b"\n")
        holder.stdin.flush()
    assert holder.returncode == 0
    assert _preload_dirs(tmp) == [legacy.name]


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tempfile``'s directory for this test only (the pool's plan is made in it)."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.anyio
async def test_a_cancelled_pool_removes_its_preload_directory(private_tmp: Path) -> None:
    with anyio.CancelScope() as scope:
        async with open_warm_pool((PYTHON, "-u"), 1, preload=("colorsys",)) as pool:
            assert pool.preload is not None
            made = Path(pool.preload.dir)
            assert made.parent == private_tmp and (made / "reported").is_dir()
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert _preload_dirs(private_tmp) == []


@pytest.mark.anyio
async def test_a_pool_that_cannot_open_leaves_no_preload_directory(private_tmp: Path) -> None:
    with pytest.raises(ValueError, match="size >= 1"):
        async with open_warm_pool((PYTHON, "-u"), 0, preload=("colorsys",)):
            pass
    assert _preload_dirs(private_tmp) == []
