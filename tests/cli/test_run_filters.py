"""``aelastic run --duplicate-std*-filters``: tee'd matching lines also go to filtered_*.log."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

SCRIPT = (
    "import os, sys\n"
    "r = os.environ['LOCAL_RANK']\n"
    "print(f'LOSS,x {r}')\n"
    "print(f'LOSS {r}')\n"
    "print(f'step ERR {r}')\n"
    "print(f'warn {r}', file=sys.stderr)\n"
)


async def test_run_writes_filtered_stdout_with_comma_escape(tmp_path: Path) -> None:
    script, logs = tmp_path / "train.py", tmp_path / "logs"
    script.write_text(SCRIPT)
    argv = [sys.executable, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "2"]
    argv += ["--tee", "3", "--duplicate-stdout-filters", "LOSS,,x,ERR", "--log-dir", str(logs)]
    with anyio.fail_after(90):
        result = await anyio.run_process([*argv, str(script)], check=False)
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert "not implemented" not in err
    (filtered,) = logs.glob("*/attempt_0/filtered_stdout.log")
    assert sorted(filtered.read_text().splitlines()) == [
        "[default0]:LOSS,x 0",
        "[default0]:step ERR 0",
        "[default1]:LOSS,x 1",
        "[default1]:step ERR 1",
    ]
    assert not list(logs.glob("*/attempt_0/filtered_stderr.log"))  # no stderr filters
    assert "[default1]:LOSS 1" in result.stdout.decode().splitlines()  # console unchanged


def test_filters_reach_the_config_without_a_warning() -> None:
    from aelastic.launcher._args import parse_run_args

    r = parse_run_args(
        ["--duplicate-stdout-filters", "a,,b,c", "--duplicate_stderr_filters", "e", "x.py"],
        {"PET_DUPLICATE_STDOUT_FILTERS": "ignored"},
    )
    assert r.config.duplicate_stdout_filters == ["a,b", "c"]
    assert r.config.duplicate_stderr_filters == ["e"]
    assert not any("filter" in w for w in r.warnings)
    env = parse_run_args(["x.py"], {"PET_DUPLICATE_STDERR_FILTERS": "x,,y"})
    assert env.config.duplicate_stderr_filters == ["x,y"]
