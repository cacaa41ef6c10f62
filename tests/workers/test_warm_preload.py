"""``--preload``: an idle warm interpreter imports modules ahead of its worker, invisibly.

Each check starts one worker from a pool that preloads (the first hand-off teaches
the pool the workers' world; the replacement interpreter preloads in it) and
compares what a second worker sees with what the first, not preloaded, one saw.
No torch here (tests/agent/test_preload.py runs the real DDP job).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from aelastic.workers import ProcessSpec, open_worker_processes
from aelastic.workers._preload import parse_preload
from aelastic.workers._warm import WarmPool, open_warm_pool

from .test_warm import PROBE, _write

PY = sys.executable

pytestmark = [
    pytest.mark.anyio,  # every backend
    pytest.mark.skipif(
        not hasattr(os, "pidfd_open"), reason="warm workers need the pidfd watcher (Linux >= 5.3)"
    ),
]

WATCHED = ("colorsys", "wave", "boom_mod")
#: PROBE, plus: which WATCHED modules were loaded before the script's first line; the
#: script then imports what PROBE_IMPORTS names (for auto to learn).
PRELOAD_PROBE = f"""\
import sys
PRE = sorted(m for m in {WATCHED!r} if m in sys.modules)


def _imports():
    import os
    for name in filter(None, os.environ.get("PROBE_IMPORTS", "").split(",")):
        try:
            __import__(name)
        except RuntimeError:
            pass


_imports()
""" + PROBE.replace(
    "print(json.dumps(out, sort_keys=True))",
    """\
import signal
out["preloaded"] = PRE
out["path"] = sys.path
out["handlers"] = {int(s): str(signal.getsignal(s)) for s in signal.valid_signals()
                   if s not in (signal.SIGKILL, signal.SIGSTOP)}
out["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
import threading
out["threads"] = [t.name for t in threading.enumerate()]
print(json.dumps(out, sort_keys=True))""",
)


@pytest.fixture(autouse=True)
def _pidfd_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AELASTIC_CHILD_WATCHER", raising=False)
    monkeypatch.delenv("AELASTIC_WARM_WORKERS", raising=False)


async def _run_twice(
    tmp: Path,
    preload: Sequence[str],
    exclude: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> tuple[dict[str, object], dict[str, object], WarmPool]:
    """What the first (taught) and the second (preloaded) worker of one pool saw."""
    script = _write(tmp / "job" / "probe.py", PRELOAD_PROBE)
    _write(tmp / "job" / "boom_mod.py", "raise RuntimeError('boom at import')\n")
    seen = []
    async with open_warm_pool((PY, "-u"), 1, preload=preload, preload_exclude=exclude) as pool:
        for tag in ("first", "second"):
            await pool.wait_ready()
            assert pool.idle_rss() > 0  # one (maybe still starting) interpreter
            spec = ProcessSpec(
                local_rank=0,
                args=[PY, "-u", script, "arg"],
                env={**os.environ, **(env or {}), "RANK": tag},
                stdout_file=str(tmp / f"{tag}.out"),
                stderr_file=str(tmp / f"{tag}.err"),
            )
            with anyio.fail_after(30):
                async with open_worker_processes([spec], warm_pool=pool) as procs:
                    exits = await procs.wait_all()
                    assert 0 in procs.warm_ranks
            assert exits[0].exitcode == 0, (tmp / f"{tag}.err").read_text()
            seen.append(json.loads((tmp / f"{tag}.out").read_text()))
    return seen[0], seen[1], pool


async def test_preloaded_worker_sees_what_a_plain_warm_worker_sees(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    first, second, _ = await _run_twice(tmp_path, ["colorsys", "boom_mod", "wave"], ["wave"])
    assert first.pop("preloaded") == []
    assert second.pop("preloaded") == ["colorsys"]  # boom_mod failed, wave excluded
    assert first["env"]["RANK"] == "first" and second["env"]["RANK"] == "second"  # type: ignore[index]
    first["env"].pop("RANK"), second["env"].pop("RANK")  # type: ignore[attr-defined]
    assert second == first  # env, argv, sys.path, cwd, __main__, signals, nice, threads
    assert second["threads"] == ["MainThread"] and not second["aelastic_loaded"]
    err = capfd.readouterr().err
    assert err.count("cannot import 'boom_mod' (RuntimeError: boom at import); skipped") == 1, err


async def test_auto_learns_what_the_workers_imported(tmp_path: Path) -> None:
    """The first worker imports colorsys, wave and boom_mod (recorded); the next one
    finds colorsys preloaded, not the excluded wave nor the job's own boom_mod."""
    env = {"PROBE_IMPORTS": "colorsys,wave,boom_mod"}
    first, second, _ = await _run_twice(tmp_path, ["auto"], ["wave"], env=env)
    assert first["preloaded"] == []
    assert second["preloaded"] == ["colorsys"]
    assert second["threads"] == ["MainThread"] and not second["aelastic_loaded"]


def test_parse_preload() -> None:
    assert parse_preload("torch, torch.optim,,auto") == ("torch", "torch.optim", "auto")
    assert parse_preload(["a", "a"]) == ("a",)
    with pytest.raises(ValueError, match="'torch/optim' is not a module name"):
        parse_preload("torch/optim")


async def test_a_preload_that_initialises_cuda_is_reported_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Stands in for a module that initialises CUDA at import (no GPU here): it leaves a
    ``torch.cuda`` whose ``is_initialized()`` is true, the only thing the guard reads."""
    _write(
        tmp_path / "job" / "cuda_at_import.py",
        "import sys, types\n"
        "cuda = types.SimpleNamespace(is_initialized=lambda: True)\n"
        "sys.modules.setdefault('torch.cuda', cuda)\n",
    )
    _, second, _ = await _run_twice(tmp_path, ["colorsys", "cuda_at_import"])
    assert second["preloaded"] == ["colorsys"]
    err = capfd.readouterr().err
    line = "--preload: importing 'cuda_at_import' initialised CUDA in an idle interpreter"
    assert err.count(line) == 1, err
    assert "keep it out of --preload" in err
