"""The first job of a service imports the agent's modules off its event loop (issue 20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aelastic._features import FILE_TIMER_ENV

SCRIPT = str(Path(__file__).parent / "scripts" / "loop_imports.py")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_first_open_job_imports_nothing_on_the_loop(backend: str) -> None:
    """A fresh interpreter runs one job with open_job; no aelastic module is imported
    on the loop's thread once the service runs (they are imported in a worker thread)."""
    done = subprocess.run(
        [sys.executable, SCRIPT, backend], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # a job without hang detection or file timer loads only the progress files' module
    # (the goodput ledger reads every job's steps), never the learned timeouts' or timer's
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "on_loop": [],
        "optional": ["aelastic.agent._hang"],
    }


def test_a_job_with_hang_detection_and_the_file_timer_loads_them_off_the_loop() -> None:
    """With a heartbeat timeout and ``TORCHELASTIC_ENABLE_FILE_TIMER=1``, open_job loads
    hang detection's and the file timer's modules, and still none on the loop's thread."""
    env = {**os.environ, FILE_TIMER_ENV: "1"}
    done = subprocess.run(
        [sys.executable, SCRIPT, "asyncio", "hang"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "on_loop": [],
        "optional": [
            "aelastic.agent._hang",
            "aelastic.agent._learned",
            "aelastic.agent._file_timer",
        ],
    }


@pytest.mark.parametrize("file_timer", [False, True])
def test_the_cli_imports_the_jobs_modules_before_its_loop(tmp_path: Path, file_timer: bool) -> None:
    """``aelastic run`` imports every module its job needs before the event loop starts,
    so the job finds nothing left to import in a thread (a thread's start and hand-offs
    would sit on the way to the workers' start); the file timer's and hang detection's
    modules only when ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` asks for them."""
    noop = tmp_path / "noop.py"
    noop.write_text("pass\n")
    script = str(Path(__file__).parent / "scripts" / "cli_imports.py")
    env = {k: v for k, v in os.environ.items() if k != FILE_TIMER_ENV}
    if file_timer:
        env[FILE_TIMER_ENV] = "1"
    done = subprocess.run(
        [sys.executable, script, str(noop)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    main_thread, other_threads, optional = json.loads(done.stdout.splitlines()[-1])
    assert "aelastic.nodes._gate" in main_thread
    assert other_threads == []
    wanted = (
        ["aelastic.agent._hang", "aelastic.agent._learned", "aelastic.agent._file_timer"]
        if file_timer
        else ["aelastic.agent._hang"]  # the progress files: every job's steps (goodput)
    )
    assert optional == wanted
    assert set(wanted) <= set(main_thread)


#: Imports the CLI's modules as ``aelastic run`` does, then, watching every AST that is built
#: (``ast.parse``, ``compile(..., PyCF_ONLY_AST)``), each module a job may import.
_AST_WATCH = """
import ast, builtins, importlib, json
import aelastic.launcher._cli
from aelastic.launcher._preimport import JOB_MODULES
built = []
parse, compile_ = ast.parse, builtins.compile
def watched_parse(source, filename="<unknown>", *args, **kwargs):
    built.append(str(filename))
    return parse(source, filename, *args, **kwargs)
def watched_compile(source, filename, mode, flags=0, *args, **kwargs):
    if flags & ast.PyCF_ONLY_AST:
        built.append(str(filename))
    return compile_(source, filename, mode, flags, *args, **kwargs)
ast.parse, builtins.compile = watched_parse, watched_compile
extra = ["aelastic.agent._hang", "aelastic.agent._learned", "aelastic.agent._file_timer",
         "aelastic.health._server", "aelastic.jobview._http", "aelastic.replicas"]
for name in [*JOB_MODULES, *extra]:
    importlib.import_module(name)
print(json.dumps(built))
"""


def test_importing_a_jobs_modules_builds_no_ast() -> None:
    """The launcher imports a job's modules in a worker thread while its loop runs
    (``import_off_loop``); on CPython 3.11.7 two threads building ASTs at once can fail
    with ``SystemError: AST constructor recursion depth mismatch`` (seen once at the start
    of an ``aelastic run``). So those imports build none: ``@dataclass`` on a class
    without a docstring parsed a signature with ``ast`` (``aelastic/_dataclass.py`` now
    avoids it), and ``anyio.abc`` parses its own source when first imported
    (``aelastic/_features.py`` imports it before any such thread)."""
    done = subprocess.run(
        [sys.executable, "-c", _AST_WATCH], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
