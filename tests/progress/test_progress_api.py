"""The worker-side progress API and the agent's reading of it (real processes, real mmap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aelastic.agent._policy import Action, decide_after_hang, progress_deadline
from aelastic.progress._exceptions import ProgressTimeoutError
from aelastic.progress._reader import ProgressFile
from aelastic.progress._timeouts import ProgressTimeouts, parse_section_timeouts

WORKER = """
import json, os, sys
from aelastic.progress import attached, heartbeat, section, step
heartbeat(); heartbeat()
with section("outer"):
    with section("inner"):
        pass
    print(json.dumps({"attached": attached()}), flush=True)
    sys.stdin.readline()  # the test reads the snapshot while we are inside "outer"
step(41); step()
top = ("anyio", "torch", "aelastic")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in top)))
"""


def test_worker_reports_through_shared_memory(tmp_path: Path) -> None:
    progress = ProgressFile(str(tmp_path / "w.progress"))
    assert not progress.snapshot().attached
    env = {**os.environ, "AELASTIC_PROGRESS_FILE": progress.path}
    with subprocess.Popen(
        [sys.executable, "-c", WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"attached": True}
        inside = progress.snapshot()
        proc.stdin.write("\n")
        proc.stdin.flush()
        modules = json.loads(proc.stdout.readline())
    assert proc.returncode == 0
    assert inside.attached and inside.beats == 2 and inside.section == "outer"
    assert inside.section_ns >= inside.last_beat_ns > inside.attach_ns > 0
    after = progress.snapshot()
    assert after.section is None and after.section_exit_ns >= inside.section_ns
    assert after.step == 42 and after.beats == 4  # step() is a heartbeat too
    assert set(after.longest_sections_ns) == {"outer", "inner"}
    assert after.max_gap_ns > 0
    # Loading the API pulls in neither anyio nor torch nor the agent.
    assert not [m for m in modules if m.split(".")[0] in ("anyio", "torch")]
    assert "aelastic.agent" not in modules
    progress.close()


def _env_without_agent() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AELASTIC_")}


def test_without_an_agent_every_call_is_a_no_op() -> None:
    code = (
        "from aelastic.progress import attached, heartbeat, section, step\n"
        "heartbeat(); step(3)\n"
        "with section('x'): pass\n"
        "@section('y')\n"
        "def f(): return 7\n"
        "assert f() == 7 and not attached()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_env_without_agent())


def test_section_timeouts_parse_and_reject_with_the_fix() -> None:
    assert parse_section_timeouts(" fwd=2, checkpoint=600 ,") == {"fwd": 2.0, "checkpoint": 600.0}
    assert parse_section_timeouts("") == {}
    for bad in ("fwd", "fwd=0", "=3", "fwd=abc", "fwd=inf"):
        with pytest.raises(ProgressTimeoutError, match="name=seconds"):
            parse_section_timeouts(bad)
    with pytest.raises(ProgressTimeoutError, match="positive number of seconds"):
        ProgressTimeouts(heartbeat=-1)
    assert not ProgressTimeouts().enabled
    assert ProgressTimeouts(sections={"x": 1}).enabled


def _snap(tmp_path: Path, **slots: int) -> object:
    from aelastic.progress import _layout as L

    progress = ProgressFile(str(tmp_path / "p"))
    raw = open(progress.path, "r+b")  # noqa: SIM115
    values = {"ATTACHED": L.MAGIC, **slots}
    for name, value in values.items():
        raw.seek(getattr(L, name) * 8)
        raw.write(value.to_bytes(8, sys.byteorder, signed=True))
    raw.close()
    snap = progress.snapshot()
    progress.close()
    return snap


def test_deadline_rules(tmp_path: Path) -> None:
    t = ProgressTimeouts(initial=10, heartbeat=2, sections={"ckpt": 60}, out_of_section=5)
    s = 1_000_000_000
    started = _snap(tmp_path, ATTACH_NS=s)
    d = progress_deadline(started, t, started_ns=s)
    assert d is not None and (d.rule, d.at_ns) == ("initial", 11 * s)
    beating = _snap(tmp_path, BEATS=3, LAST_BEAT_NS=4 * s)
    d = progress_deadline(beating, t, started_ns=s)
    assert d is not None and (d.rule, d.at_ns) == ("heartbeat", 6 * s)
    # Out of section since 3 s: the out-of-section rule (8 s) is later than the heartbeat one.
    both = _snap(tmp_path, BEATS=3, LAST_BEAT_NS=4 * s, SECTION_EXIT_NS=3 * s)
    d = progress_deadline(both, t, started_ns=s)
    assert d is not None and d.rule == "heartbeat"
    quiet = ProgressTimeouts(out_of_section=5)
    d = progress_deadline(both, quiet, started_ns=s)
    assert d is not None and (d.rule, d.at_ns) == ("out-of-section", 8 * s)
    assert progress_deadline(_snap(tmp_path), ProgressTimeouts(heartbeat=1), s) is None
    assert progress_deadline(_snap(tmp_path, ATTACHED=0), t, s) is None  # never attached


def test_leaving_a_long_timed_section_is_progress_not_a_missed_heartbeat(
    tmp_path: Path,
) -> None:
    t = ProgressTimeouts(heartbeat=2, sections={"ckpt": 120})
    s = 1_000_000_000
    # Last heartbeat at 4 s, then 60 s in "ckpt", left at 64 s: due at 66 s, not 6 s.
    left = _snap(tmp_path, BEATS=3, LAST_BEAT_NS=4 * s, SECTION_EXIT_NS=64 * s)
    d = progress_deadline(left, t, started_ns=s)
    assert d is not None and (d.rule, d.at_ns) == ("heartbeat", 66 * s)


def test_a_hang_in_an_untimed_section_before_the_first_heartbeat_is_caught(
    tmp_path: Path,
) -> None:
    t = ProgressTimeouts(initial=10, heartbeat=2)
    s = 1_000_000_000
    # Entered "load" (no timeout) at 2 s, never heartbeated, never left it.
    stuck = _snap(tmp_path, SECTION=1, SECTION_NS=2 * s, NAMES=1)
    d = progress_deadline(stuck, t, started_ns=s)
    assert d is not None and (d.rule, d.at_ns, d.section) == ("initial", 11 * s, "")
    # After the first section exit the initial timeout is done with.
    assert progress_deadline(_snap(tmp_path, SECTION_EXIT_NS=3 * s), t, started_ns=s) is None


def test_after_a_hang_the_budget_decides() -> None:
    assert decide_after_hang(2).action is Action.RESTART
    assert decide_after_hang(2).remaining_restarts == 1
    assert decide_after_hang(0).action is Action.FAIL


def test_a_forked_child_does_not_heartbeat_for_its_parent(tmp_path: Path) -> None:
    progress = ProgressFile(str(tmp_path / "w.progress"))
    code = (
        "import os\n"
        "from aelastic.progress import attached, heartbeat\n"
        "heartbeat()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    heartbeat(); heartbeat()\n"
        "    os._exit(0 if not attached() else 1)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n"
    )
    env = {**_env_without_agent(), "AELASTIC_PROGRESS_FILE": progress.path}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert progress.snapshot().beats == 1
    progress.close()


def test_a_spawned_child_does_not_attach_for_its_parent(tmp_path: Path) -> None:
    """A process the worker starts (a spawn-started data loader worker, mp.spawn) imports
    aelastic.progress too: it must neither reset the worker's step nor heartbeat for it."""
    progress = ProgressFile(str(tmp_path / "w.progress"))
    child = (
        "import os\n"
        "from aelastic.progress import attached, heartbeat, step\n"
        "step(0); heartbeat()\n"
        "print(attached(), sorted(k for k in os.environ if k.startswith('AELASTIC_')))\n"
    )
    code = (
        "import subprocess, sys\n"
        "from aelastic.progress import step\n"
        "step(5)\n"
        f"sys.stdout.write(subprocess.run([sys.executable, '-c', {child!r}],"
        " capture_output=True, text=True, check=True).stdout)\n"
    )
    env = {
        **_env_without_agent(),
        "AELASTIC_PROGRESS_FILE": progress.path,
        "AELASTIC_STACKS_FILE": str(tmp_path / "stacks.txt"),
        "AELASTIC_STACKS_SIGNAL": "40",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out == "False []\n"
    snap = progress.snapshot()
    assert (snap.step, snap.beats) == (5, 1)
    progress.close()


GOODPUT_WORKER = """
import sys
from aelastic.progress import checkpoint_blocked, step
if sys.argv[1] == "own":
    step(7); step()
    checkpoint_blocked("save", 5, step=99)  # the worker reports steps: not a step
else:
    checkpoint_blocked("save", 10, step=5)
    checkpoint_blocked("save", 10, step=6)
checkpoint_blocked("load", 3)
"""


@pytest.mark.parametrize(("mode", "first", "last", "saved"), [("own", 7, 8, 5), ("ckpt", 5, 6, 20)])
def test_first_step_and_checkpoint_blocking_for_the_goodput_ledger(
    tmp_path: Path, mode: str, first: int, last: int, saved: int
) -> None:
    progress = ProgressFile(str(tmp_path / "w.progress"))
    env = {**os.environ, "AELASTIC_PROGRESS_FILE": progress.path}
    subprocess.run([sys.executable, "-c", GOODPUT_WORKER, mode], env=env, check=True)
    snap = progress.snapshot()
    assert (snap.first_step, snap.step) == (first, last)
    assert snap.step_ns >= snap.first_step_ns > snap.attach_ns
    assert (snap.checkpoint_save_ns, snap.checkpoint_load_ns) == (saved, 3)


def test_a_worker_whose_script_ended_is_not_judged(tmp_path: Path) -> None:
    """The file marks the end of the script before threads are joined and atexit
    handlers run: a worker held in its shutdown has no deadline (issue 40, item 9)."""
    progress = ProgressFile(str(tmp_path / "w.progress"))
    code = (
        "import atexit, sys\n"
        "from aelastic.progress import step\n"
        "def held():\n"
        "    print('exiting', flush=True)\n"
        "    sys.stdin.readline()  # the test reads the file while we are held here\n"
        "atexit.register(held)\n"
        "step(7)\n"
        "print('ran', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    env = {**_env_without_agent(), "AELASTIC_PROGRESS_FILE": progress.path}
    t = ProgressTimeouts(heartbeat=1, sections={"ckpt": 60})
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == b"ran\n"
        running = progress.snapshot()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"exiting\n"
        exiting = progress.snapshot()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
    assert proc.returncode == 0
    assert running.ended_ns == 0 and running.step == 7
    assert progress_deadline(running, t, started_ns=0) is not None  # judged while it runs
    assert exiting.ended_ns >= exiting.last_beat_ns > 0
    assert progress_deadline(exiting, t, started_ns=0) is None
    s = 1_000_000_000
    # The rule alone: ended inside a timed section, or before any heartbeat: not judged.
    in_section = _snap(tmp_path, BEATS=1, LAST_BEAT_NS=s, SECTION=1, NAMES=1, ENDED_NS=2 * s)
    assert progress_deadline(in_section, t, started_ns=s) is None
    assert progress_deadline(_snap(tmp_path, ENDED_NS=s), ProgressTimeouts(initial=1), s) is None
    progress.close()
