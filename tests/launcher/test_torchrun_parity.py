"""Differential test: the same worker scripts under torchrun 2.13 and ``aelastic run``.

Each scenario runs ``python -m torch.distributed.run FLAGS ...`` and ``python -m aelastic
run FLAGS ...`` with the same flags, environment and cwd (all scenarios run at once, in
one module fixture: a torchrun launch costs ~2.5 s). The worker
(``scripts/parity_worker.py``) dumps what it saw; the tests compare, per scenario, the
workers' environment (names and values), argv, cwd, signal dispositions and mask, the
worker lines on the console, the log directory layout and file contents, the failure
summary's entries, the workers' error files and the launcher's own error file.

Values that must differ between two launches are normalised (each rule below says
why); every other difference fails the test unless it is on :data:`ALLOWED`, which the
"What is different from torchrun" (docs/differences.md) states too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("torch") is None:  # not imported here: it costs seconds
    pytest.skip("torchrun needs torch", allow_module_level=True)

SCRIPTS = Path(__file__).parent / "scripts"
WORKER = str(SCRIPTS / "parity_worker.py")
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "aelastic": [sys.executable, "-m", "aelastic", "run"],
}
LOG_DIR = "{log_dir}"  # replaced by a directory of each launch's own

#: (scenario or "*", what differs) -> why. Every entry is also a line of docs/differences.md's
#: "What is different from torchrun".
ALLOWED: dict[tuple[str, str], str] = {
    ("*", "env MASTER_ADDR"): (
        "the agent hosts each round's worker store on 127.0.0.1 only and says so; "
        "torchrun says 'localhost', which may resolve to ::1"
    ),
    ("*", "default log dir prefix"): (
        "the default log directory is a new temp dir named aelastic_* (torchrun: torchelastic_*)"
    ),
    ("run_path", "path0"): (
        "--run-path: sys.path[0] is the script's directory, as for 'python SCRIPT'; "
        "torchrun leaves its own (the launcher's cwd)"
    ),
    ("run_path", "own_process_group"): (
        "every worker leads its own session and process group; torchrun's --run-path "
        "workers are multiprocessing children in the launcher's"
    ),
    ("run_path", "own_session"): "the session too, for the same reason as the process group",
    ("run_path", "summary title"): (
        "--run-path: the failure summary names the script; torchrun names its internal "
        "run_script_path function"
    ),
    ("*", "checkpoint env"): (  # the README's marker; now every AELASTIC_* variable
        "AELASTIC_* variables of aelastic's own worker services: AELASTIC_CHECKPOINT_* tell "
        "aelastic.checkpoint where the agent's memory is and which step to resume from, "
        "AELASTIC_PROGRESS_FILE where aelastic.progress reports steps (the goodput ledger); "
        "torchrun has no such services"
    ),
}

#: The variables of aelastic's own worker services, compared as "checkpoint env".
_AELASTIC_ENV = "AELASTIC_"


@dataclass(frozen=True)
class Scenario:
    flags: list[str]
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None  # None: a shared scratch directory
    #: start the launcher as 'nohup ... &' would: SIGHUP, SIGINT and SIGQUIT ignored
    background: bool = False


_NPROC2 = ["--standalone", "--nproc-per-node", "2"]
# ``sh -c`` records its own argv (from /proc, as the kernel has it) in the environment,
# then execs the Python worker: --no-python with a command found on PATH. Both
# launchers substitute ${macros} in the arguments, so "$$" is written "$$$$".
_SH = 'PARITY_SH_ARGV="$(tr "\\000" " " </proc/$$$$/cmdline)" exec "$0" "$@"'
# Four scenarios (a torchrun launch costs ~3 s of CPU), each batching checks that do
# not interfere: logs and console options are orthogonal to how the worker starts and
# ends (the failure comes after the worker has recorded and printed).
SCENARIOS: dict[str, Scenario] = {
    # both ranks fail under torch's @record; rank 0 redirected to files, rank 1 on the console
    "record": Scenario(
        [*_NPROC2, "--log-dir", LOG_DIR, "--redirects", "0:3"],
        [WORKER, "a", "b"],
        env={"PARITY_FAIL_RANKS": "0,1", "PARITY_RECORD": "1", "PARITY_BARRIER": "1"},
    ),
    # --log-dir /dev/null: rank 0 redirected, rank 1 tee'd
    "no_python": Scenario(
        [*_NPROC2, "--log-dir", "/dev/null", "-r", "0:3", "-t", "1:3", "--no-python"],
        ["sh", "-c", _SH, sys.executable, WORKER, "x y"],
    ),
    # rank 1 fails, uncaught (torchrun records it all the same)
    "run_path": Scenario(
        [*_NPROC2, "--run-path"],
        [WORKER, "r"],
        env={"PARITY_FAIL_RANKS": "1", "PARITY_BARRIER": "1"},
    ),
    "module": Scenario(
        [*_NPROC2, "--log-dir", LOG_DIR, "--tee", "3", "--local-ranks-filter", "1", "-m"],
        ["parity_worker", "m"],
        cwd=str(SCRIPTS),
        background=True,
    ),
}


@dataclass
class Run:
    """One launch: its exit code, console, the workers' records and its directories."""

    scenario: str
    launcher: str
    code: int
    stdout: str
    stderr: str
    out: Path
    tmp: Path
    log_dir: Path | None
    launcher_error_file: Path
    seen: dict[str, dict[str, Any]]

    @property
    def run_id(self) -> str:
        ids = {str(rec["env"]["TORCHELASTIC_RUN_ID"]) for rec in self.seen.values()}
        assert len(ids) == 1, ids
        return ids.pop()

    def norm(self, text: str) -> str:
        """``text`` with the values that must differ between two launches replaced."""
        # The test gives each launch its own output, log and temporary directory.
        text = text.replace(str(self.out), "<OUT>")
        if self.log_dir is not None:
            text = text.replace(str(self.log_dir), "<LOG_DIR>")
        text = text.replace(str(self.tmp), "<TMP>")
        # The default log directory is a fresh mkdtemp(): random by construction. Its
        # name's prefix is compared on its own (default_log_prefix).
        text = re.sub(r"<TMP>/(torchelastic|aelastic)_[A-Za-z0-9_]+", "<DEFAULT_LOG_DIR>", text)
        # The per-agent run directory's name: test_run_directory_is_per_agent.
        text = re.sub(
            r"(<LOG_DIR>|<DEFAULT_LOG_DIR>)/[^/]+/attempt_", r"\1/<RUN_DIR>/attempt_", text
        )
        # --standalone draws a random run id.
        return text.replace(self.run_id, "<RUN_ID>") if self.seen else text

    def default_log_prefix(self, rank: str) -> str | None:
        """The name prefix of the default log directory (None with --log-dir)."""
        path = Path(self.seen[rank]["env"].get("TORCHELASTIC_ERROR_FILE", "/"))
        if self.tmp not in path.parents:
            return None
        return path.relative_to(self.tmp).parts[0].rpartition("_")[0]


def _command(name: str, scenario: Scenario, log_dir: Path) -> list[str]:
    flags = [str(log_dir) if f == LOG_DIR else f for f in scenario.flags]
    command = [*LAUNCHERS[name], *flags, *scenario.args]
    if scenario.background:  # what 'nohup launcher &' leaves the launcher with
        command = ["sh", "-c", 'trap "" HUP INT QUIT; exec "$@"', "sh", *command]
    return command


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Run]]]:
    """Every scenario under both launchers, all started at once; ``runs[scenario][launcher]``."""
    base = tmp_path_factory.mktemp("parity")
    scratch = base / "cwd"
    scratch.mkdir()
    # PET_* and TORCHELASTIC_* would be read by either launcher as settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("OMP_NUM_THREADS", None)  # both launchers then set it to 1 (nproc 2)
    started = []
    for scenario_name, scenario in SCENARIOS.items():
        for name in LAUNCHERS:
            where = base / f"{scenario_name}-{name}"
            out, log_dir, tmp = where / "out", where / "logs", where / "tmp"
            for directory in (out, log_dir, tmp):
                directory.mkdir(parents=True)
            launch_env = {**env, **scenario.env}
            if "PARITY_BARRIER" in launch_env:  # a FIFO the two ranks meet at
                os.mkfifo(out / "barrier")
                launch_env["PARITY_BARRIER"] = str(out / "barrier")
            launch_env = {
                **launch_env,
                "PARITY_OUT": str(out),
                # default log directories land here, and are removed with it
                "TMPDIR": str(tmp),
                # schedulers read the launcher's own error file
                "TORCHELASTIC_ERROR_FILE": str(where / "launcher_error.json"),
            }
            stdout, stderr = (where / "stdout").open("w+"), (where / "stderr").open("w+")
            process = subprocess.Popen(
                _command(name, scenario, log_dir),
                env=launch_env,
                cwd=scenario.cwd or scratch,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
            started.append((scenario_name, name, process, stdout, stderr, where))
    results: dict[str, dict[str, Run]] = {s: {} for s in SCENARIOS}
    try:
        for scenario_name, name, process, stdout, stderr, where in started:
            code = process.wait(timeout=100)
            stdout.seek(0)
            stderr.seek(0)
            out = where / "out"
            scenario = SCENARIOS[scenario_name]
            results[scenario_name][name] = Run(
                scenario=scenario_name,
                launcher=name,
                code=code,
                stdout=stdout.read(),
                stderr=stderr.read(),
                out=out,
                tmp=where / "tmp",
                log_dir=where / "logs" if LOG_DIR in scenario.flags else None,
                launcher_error_file=where / "launcher_error.json",
                seen={p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))},
            )
        yield results
    finally:
        for _, _, process, stdout, stderr, _ in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            stdout.close()
            stderr.close()


# -- comparing ------------------------------------------------------------------------


def _allowed(scenario: str, what: str) -> bool:
    what = re.sub(r" \(rank \d+\)$", "", what)  # an entry covers every rank
    return (scenario, what) in ALLOWED or ("*", what) in ALLOWED


def _differences(scenario: str, pairs: dict[str, tuple[Any, Any]]) -> list[str]:
    """Lines naming every pair that differs and is not allow-listed."""
    return [
        f"{scenario}: {what}: torchrun={theirs!r} aelastic={ours!r}"
        for what, (theirs, ours) in pairs.items()
        if theirs != ours and not _allowed(scenario, what)
    ]


def _both(runs: dict[str, dict[str, Run]], scenario: str) -> tuple[Run, Run]:
    theirs, ours = runs[scenario]["torchrun"], runs[scenario]["aelastic"]
    for run in (theirs, ours):
        assert sorted(run.seen) == ["0", "1"], (run.launcher, run.stdout, run.stderr)
    return theirs, ours


def _env(run: Run, rank: str) -> dict[str, str]:
    env = dict(run.seen[rank]["env"])
    # The shell's own argv: compared by test_no_python_keeps_argv0.
    env.pop("PARITY_SH_ARGV", None)
    # A free port picked at run time.
    if "MASTER_PORT" in env:
        env["MASTER_PORT"] = "<PORT>"
    return {k: run.norm(v) for k, v in env.items()}


def _env_pairs(theirs: Run, ours: Run) -> dict[str, tuple[Any, Any]]:
    pairs: dict[str, tuple[Any, Any]] = {}
    for rank in ("0", "1"):
        a, b = _env(theirs, rank), _env(ours, rank)
        mine = [name for name in b if name.startswith(_AELASTIC_ENV)]
        pairs[f"checkpoint env (rank {rank})"] = ([], mine)
        b = {k: v for k, v in b.items() if k not in mine}
        pairs[f"env names (rank {rank})"] = (sorted(a), sorted(b))
        for name in sorted(set(a) & set(b)):
            pairs[f"env {name} (rank {rank})"] = (a[name], b[name])
        pairs[f"default log dir prefix (rank {rank})"] = (
            theirs.default_log_prefix(rank),
            ours.default_log_prefix(rank),
        )
    return pairs


def _worker_pairs(theirs: Run, ours: Run) -> dict[str, tuple[Any, Any]]:
    pairs = _env_pairs(theirs, ours)
    for rank in ("0", "1"):
        a, b = theirs.seen[rank], ours.seen[rank]
        for what in ("argv", "cwd", "name", "path0", "stdin", "own_process_group", "own_session"):
            pairs[f"{what} (rank {rank})"] = (theirs.norm(str(a[what])), ours.norm(str(b[what])))
    return pairs


def _signal_pairs(theirs: Run, ours: Run) -> dict[str, tuple[Any, Any]]:
    pairs: dict[str, tuple[Any, Any]] = {}
    for rank in ("0", "1"):
        a, b = theirs.seen[rank], ours.seen[rank]
        for what in ("SigBlk", "SigIgn", "SigCgt"):
            pairs[f"signals {what} (rank {rank})"] = (
                a["proc_status"][what],
                b["proc_status"][what],
            )
        pairs[f"signals getsignal (rank {rank})"] = (a["getsignal"], b["getsignal"])
        pairs[f"signals mask (rank {rank})"] = (a["mask"], b["mask"])
    return pairs


def _worker_lines(text: str) -> list[str]:
    # Only the workers' lines: each launcher's own messages (torchrun's OMP banner, our
    # warning) are not worker output. Sorted: two workers write concurrently.
    return sorted(line for line in text.splitlines() if "parity std" in line)


def _console_pairs(theirs: Run, ours: Run) -> dict[str, tuple[Any, Any]]:
    return {
        "console stdout": (_worker_lines(theirs.stdout), _worker_lines(ours.stdout)),
        "console stderr": (_worker_lines(theirs.stderr), _worker_lines(ours.stderr)),
    }


def _layout(run: Run) -> dict[str, str]:
    """``{path under the run directory: content}``; error files are compared elsewhere."""
    assert run.log_dir is not None
    files: dict[str, str] = {}
    for path in sorted(run.log_dir.rglob("*")):
        if path.is_file():
            parts = path.relative_to(run.log_dir).parts
            rel = "/".join(("<RUN_DIR>", *parts[1:]))
            files[rel] = "<error file>" if path.name == "error.json" else path.read_text()
    return files


def _run_dirs(run: Run) -> list[str]:
    assert run.log_dir is not None
    # torchrun names it mkdtemp(prefix=f"{run_id}_"): the suffix is random.
    names = [p.name.replace(run.run_id, "<RUN_ID>") for p in run.log_dir.iterdir()]
    return [re.sub(r"^<RUN_ID>_[A-Za-z0-9_]{8}$", "<RUN_ID>_<RANDOM>", n) for n in names]


_ENTRY = re.compile(
    r"\[\d+\]:\n  time      : (?P<time>.*)\n  host      : (?P<host>.*)\n"
    r"  rank      : (?P<rank>\d+) \(local_rank: (?P<local_rank>\d+)\)\n"
    r"  exitcode  : (?P<exitcode>-?\d+) \(pid: \d+\)(?P<signal>.*)\n"
    r"  error_file: (?P<error_file>.*)\n"
    r"  traceback : (?P<traceback>(?:.*\n)*?)(?=\[\d+\]:|-{20,}|={20,})"
)


def _traceback(run: Run, text: str) -> list[str]:
    """The worker script's own frames and the exception line.

    Frames of the machinery around the script (torch's @record wrapper, torchrun's
    run_script_path and runpy) differ by construction of each launcher.
    """
    lines = [line.strip() for line in text.strip().splitlines()]
    keep: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("File ") and WORKER in line:
            keep += [re.sub(r", line \d+", "", line), lines[i + 1] if i + 1 < len(lines) else ""]
    return [run.norm(line) for line in keep] + lines[-1:]


def _summary(run: Run) -> dict[str, Any]:
    """The ChildFailedError summary: title, root cause's rank and every entry."""
    title = re.search(r"^(.*) FAILED$", run.stderr, re.MULTILINE)
    entries = []
    raw_error_files = {}
    for m in _ENTRY.finditer(run.stderr):
        raw_error_files[int(m["rank"])] = m["error_file"]
        entries.append(
            {
                "rank": int(m["rank"]),
                "local_rank": int(m["local_rank"]),
                "exitcode": int(m["exitcode"]),
                "signal": m["signal"].strip(),
                "error_file": run.norm(m["error_file"]),
                "traceback": _traceback(run, m["traceback"]),
            }
        )
    root = run.stderr.partition("Root Cause (first observed failure):")[2]
    root_match = _ENTRY.search(root)
    return {
        "summary title": run.norm(title.group(1)) if title else None,
        # Which of two failures in the same instant is "first" is a race in both.
        "entries": sorted(entries, key=lambda e: e["rank"]),
        "root_rank": int(root_match["rank"]) if root_match else None,
        "no_other_failures": "<NO_OTHER_FAILURES>" in run.stderr,
        "raw_error_files": raw_error_files,
    }


def _error_file(run: Run, path: Path) -> dict[str, Any] | None:
    """An error file's content, as torch's schema has it; None when there is none."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    message = data.get("message")
    if not isinstance(message, dict):
        return {"message": message, "errorCode": data.get("errorCode")}
    # The timestamp (time of the failure) is left out.
    return {
        "message": message.get("message"),
        "traceback": _traceback(run, message.get("extraInfo", {}).get("py_callstack", "")),
        "errorCode": data.get("errorCode"),
    }


def _error_files(run: Run) -> dict[str, Any]:
    """``{"rank R": content}`` of the error file each summary entry names."""
    raw = _summary(run)["raw_error_files"]
    return {f"rank {r}": _error_file(run, Path(path)) for r, path in sorted(raw.items())}


def _assert_same(scenario: str, pairs: dict[str, tuple[Any, Any]]) -> None:
    problems = _differences(scenario, pairs)
    assert not problems, "\n".join(problems)


# -- the tests --------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_worker_sees_the_same(runs: dict[str, dict[str, Run]], scenario: str) -> None:
    theirs, ours = _both(runs, scenario)
    _assert_same(scenario, _worker_pairs(theirs, ours))


def test_no_python_keeps_argv0(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "no_python")
    pairs = {
        f"sh argv (rank {r})": (
            theirs.seen[r]["env"]["PARITY_SH_ARGV"],
            ours.seen[r]["env"]["PARITY_SH_ARGV"],
        )
        for r in ("0", "1")
    }
    assert theirs.seen["0"]["env"]["PARITY_SH_ARGV"].startswith("sh -c ")
    _assert_same("no_python", pairs)


@pytest.mark.parametrize("scenario", ["no_python", "run_path", "record"])
def test_signal_dispositions_and_mask(runs: dict[str, dict[str, Run]], scenario: str) -> None:
    theirs, ours = _both(runs, scenario)
    _assert_same(scenario, _signal_pairs(theirs, ours))


def test_signals_when_started_in_the_background(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "module")
    assert theirs.seen["0"]["getsignal"]["SIGINT"] == "handler"  # torchrun resets it
    _assert_same("module", _signal_pairs(theirs, ours))


@pytest.mark.parametrize("scenario", ["record", "module"])
def test_console_output(runs: dict[str, dict[str, Run]], scenario: str) -> None:
    theirs, ours = _both(runs, scenario)
    assert _worker_lines(theirs.stdout + theirs.stderr)  # there is something to compare
    _assert_same(scenario, _console_pairs(theirs, ours))


def test_console_output_with_log_dir_dev_null(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "no_python")
    assert len(_worker_lines(theirs.stdout)) == 2
    _assert_same("no_python", _console_pairs(theirs, ours))


@pytest.mark.parametrize("scenario", ["module", "record"])
def test_log_directory_layout(runs: dict[str, dict[str, Run]], scenario: str) -> None:
    theirs, ours = _both(runs, scenario)
    assert _layout(theirs)
    _assert_same(scenario, {"log files": (_layout(theirs), _layout(ours))})


def test_run_directory_is_per_agent(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "record")
    assert _run_dirs(theirs) == ["<RUN_ID>_<RANDOM>"]
    _assert_same("record", {"run directory": (_run_dirs(theirs), _run_dirs(ours))})


def test_failure_exit_codes(runs: dict[str, dict[str, Run]]) -> None:
    pairs = {
        f"{s} exit code": (runs[s]["torchrun"].code, runs[s]["aelastic"].code) for s in SCENARIOS
    }
    assert runs["record"]["torchrun"].code == 1
    _assert_same("*", pairs)


def test_failure_summary_lists_every_failure(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "record")
    a, b = _summary(theirs), _summary(ours)
    assert [e["rank"] for e in a["entries"]] == [0, 1]
    pairs: dict[str, tuple[Any, Any]] = {
        key: (a[key], b[key]) for key in ("summary title", "entries", "no_other_failures")
    }
    pairs["error files"] = (_error_files(theirs), _error_files(ours))
    _assert_same("record", pairs)


def test_failure_summary_root_cause(runs: dict[str, dict[str, Run]]) -> None:
    for run in runs["record"].values():
        summary = _summary(run)
        assert summary["root_rank"] in (0, 1), run.stderr
        assert "Traceback" in run.stderr


def test_launcher_error_file(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "record")
    # torchrun copies the root cause's error file there; which rank is the root cause
    # may differ (two failures in the same instant), so each side is compared to its own.
    same_as_root = []
    for run in (theirs, ours):
        root = _error_files(run).get(f"rank {_summary(run)['root_rank']}")
        content = _error_file(run, run.launcher_error_file)
        same_as_root.append(content is not None and content == root)
    assert same_as_root[0], theirs.stderr
    _assert_same(
        "record", {"launcher error file is the root cause's": (same_as_root[0], same_as_root[1])}
    )


def test_run_path_failure_is_recorded(runs: dict[str, dict[str, Run]]) -> None:
    theirs, ours = _both(runs, "run_path")
    a, b = _summary(theirs), _summary(ours)
    assert [e["rank"] for e in a["entries"]] == [1]
    pairs: dict[str, tuple[Any, Any]] = {
        key: (a[key], b[key]) for key in ("summary title", "entries", "root_rank")
    }
    pairs["error files"] = (_error_files(theirs), _error_files(ours))
    _assert_same("run_path", pairs)


def test_every_allowed_difference_occurs(runs: dict[str, dict[str, Run]]) -> None:
    # An entry no launch needs any more must leave the list (and docs/differences.md).
    seen: set[tuple[str, str]] = set()
    for scenario in SCENARIOS:
        theirs, ours = _both(runs, scenario)
        pairs = {**_worker_pairs(theirs, ours), **_signal_pairs(theirs, ours)}
        pairs["summary title"] = (
            _summary(theirs)["summary title"],
            _summary(ours)["summary title"],
        )
        for what, (a, b) in pairs.items():
            what = re.sub(r" \(rank \d+\)$", "", what)
            if a != b:
                seen |= {key for key in ((scenario, what), ("*", what)) if key in ALLOWED}
    assert sorted(seen) == sorted(ALLOWED)


def test_allow_list_is_in_the_readme() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "differences.md").read_text()
    section = readme.partition("# What is different from torchrun")[2].partition("\n## Other")[0]
    for (_, what), _reason in ALLOWED.items():
        assert f"<!-- parity: {what} -->" in section, what
