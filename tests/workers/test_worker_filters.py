"""Duplicate filters: tee'd lines containing a substring also land in filtered_std*.log."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import anyio
import pytest

from aelastic.agent import WorkerSpec
from aelastic.agent._exceptions import AgentConfigError
from aelastic.workers import ProcessSpec, open_worker_processes
from aelastic.workers._logs import LogDestinations
from aelastic.workers._std import Std

pytestmark = pytest.mark.anyio  # every backend: the agent reads the piped output

# Each worker prints a few stdout lines (some matching), a partial last line, and stderr.
WORKER = (
    "import sys\n"
    "r = sys.argv[1]\n"
    "print(f'LOSS,x {r}')\n"
    "print(f'LOSS {r} no comma')\n"
    "print(f'plain {r}')\n"
    "print(f'an ERR {r}', flush=True)\n"
    "print(f'warn {r}', file=sys.stderr)\n"
    "print(f'quiet {r}', file=sys.stderr)\n"
    "print(f'ERR tail {r}', end='')\n"
)


async def run(dest: LogDestinations, n: int) -> None:
    specs = [
        dest.process_spec(r, [sys.executable, "-c", WORKER, str(r)], os.environ) for r in range(n)
    ]
    with anyio.fail_after(30):
        async with open_worker_processes(specs) as w:
            exits = await w.wait_all()
    assert all(e.exitcode == 0 for e in exits.values())


def lines(path: str | None) -> list[str]:
    assert path is not None
    return sorted(Path(path).read_text().splitlines())


def attempt(
    tmp: Path,
    n: int,
    tee: str | int,
    out: list[str] | None,
    err: list[str] | None = None,
    **kw: object,
) -> LogDestinations:
    return LogDestinations.for_attempt(
        str(tmp),
        "job",
        0,
        n,
        tee=tee,
        duplicate_stdout_filters=out,
        duplicate_stderr_filters=err,
        **kw,  # type: ignore[arg-type]
    )


async def test_tee_d_matching_lines_land_in_one_file_per_attempt(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # rank 0 tees both streams, rank 1 stdout only, rank 2 nothing (redirected only).
    dest = LogDestinations.for_attempt(
        str(tmp_path),
        "job",
        0,
        3,
        redirects="2:3",
        tee="0:3,1:1",
        duplicate_stdout_filters=["LOSS,x", "ERR"],
        duplicate_stderr_filters=["warn"],
    )
    assert dest.attempt_dir is not None
    attempt_dir = Path(dest.attempt_dir)
    assert dest.filtered_stdout == str(attempt_dir / "filtered_stdout.log")
    await run(dest, 3)
    assert lines(dest.filtered_stdout) == [
        "[default0]:ERR tail 0",
        "[default0]:LOSS,x 0",
        "[default0]:an ERR 0",
        "[default1]:ERR tail 1",
        "[default1]:LOSS,x 1",
        "[default1]:an ERR 1",
    ]
    assert lines(dest.filtered_stderr) == ["[default0]:warn 0"]
    # the console and the per-rank files are what they were without filters
    out, err = capfd.readouterr()
    assert "[default1]:plain 1" in out.splitlines()
    assert any(line.endswith("warn 1") for line in err.splitlines())  # not tee'd: no copy
    assert "plain 2" in (attempt_dir / "2/stdout.log").read_text()


async def test_ranks_hidden_by_local_ranks_filter_are_not_duplicated(tmp_path: Path) -> None:
    # torch tails (and so filters) only the ranks the console shows.
    dest = attempt(tmp_path, 2, 3, ["LOSS,x"], local_ranks_filter={1})
    await run(dest, 2)
    assert lines(dest.filtered_stdout) == ["[default1]:LOSS,x 1"]
    assert dest.filtered_stderr is None
    assert dest.attempt_dir is not None
    assert not await anyio.Path(dest.attempt_dir, "filtered_stderr.log").exists()


async def test_prefix_template_applies_to_the_filtered_file(tmp_path: Path) -> None:
    dest = attempt(tmp_path, 1, 1, ["plain"], prefix_template="<${role_name}:${rank}> ", role="t")
    await run(dest, 1)
    assert lines(dest.filtered_stdout) == ["<t:0> plain 0"]


async def test_filters_without_tee_give_an_empty_file(tmp_path: Path) -> None:
    dest = attempt(tmp_path, 1, 0, ["LOSS"], ["warn"], redirects=3)
    await run(dest, 1)
    assert lines(dest.filtered_stdout) == []
    assert lines(dest.filtered_stderr) == []


async def test_devnull_log_dir_writes_no_filtered_file() -> None:
    dest = LogDestinations.for_attempt(
        os.devnull, "job", 0, 1, tee=Std.ALL, duplicate_stdout_filters=["LOSS"]
    )
    assert dest.filtered_stdout is None
    await run(dest, 1)


@pytest.mark.parametrize("bad", ["LOSS", [b"LOSS"], [1]])
def test_bad_filter_lists_are_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="duplicate_stdout_filters"):
        attempt(tmp_path, 1, 1, bad)  # type: ignore[arg-type]
    env: Mapping[str, str] = {}
    with pytest.raises(ValueError, match="duplicate_stderr_filters"):
        spec = ProcessSpec(0, [sys.executable], env, duplicate_stderr_filters=bad)  # type: ignore[arg-type]
        anyio.run(_open, spec)
    with pytest.raises(AgentConfigError, match="duplicate_stdout_filters"):
        WorkerSpec("r", 1, None, "x", duplicate_stdout_filters=bad)  # type: ignore[arg-type]


async def _open(spec: ProcessSpec) -> None:
    async with open_worker_processes([spec]):
        pass
