"""Log layout, redirects, tee with prefix, and the local-ranks filter."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.workers import WorkerStartError
from aelastic.workers._logs import LogDestinations, make_run_log_dir
from aelastic.workers._std import Std, parse_std_spec

SCRIPT = os.path.join(os.path.dirname(__file__), "agent_script.py")


@pytest.fixture(params=["asyncio", "uvloop", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    """The event loop of the agent process (it reads the workers' piped output)."""
    name: str = request.param
    if name != "asyncio":
        pytest.importorskip(name)
    return name


async def run_agent(cfg: dict[str, object], backend: str) -> tuple[list[str], list[str], str]:
    cfg = {**cfg, "backend": backend}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, SCRIPT, "logs", json.dumps(cfg)], check=False
        )
    out = result.stdout.decode().splitlines()
    err = result.stderr.decode().splitlines()
    assert result.returncode == 0, result.stderr.decode()
    attempt_dir = out.pop().split(" ", 1)[1]
    return out, err, attempt_dir


async def test_tee_with_prefix_and_local_ranks_filter(tmp_path: Path, backend: str) -> None:
    out, err, attempt = await run_agent(
        {"n": 2, "log_dir": str(tmp_path), "tee": 3, "filter": [0]}, backend
    )
    assert sorted(out) == [
        "[default0]:out 0 0",
        "[default0]:out 0 1",
        "[default0]:out 0 2",
        "[default0]:partial",
    ]
    assert err == ["[default0]:err 0"]
    run_dir = Path(attempt).parent
    assert run_dir.parent == tmp_path and run_dir.name.startswith("job1_")
    assert Path(attempt).name == "attempt_0"
    for rank in (0, 1):  # files are unaffected by the filter
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text() == (
            f"out {rank} 0\nout {rank} 1\nout {rank} 2\npartial"
        )
        assert (run_dir / "attempt_0" / str(rank) / "stderr.log").read_text() == (f"err {rank}\n")


async def test_redirect_only_keeps_console_clean(tmp_path: Path, backend: str) -> None:
    out, err, attempt = await run_agent(
        {"n": 2, "log_dir": str(tmp_path), "redirects": "0:1,1:3"}, backend
    )
    # rank 0 stderr was not redirected: it reaches the console unprefixed.
    assert out == []
    assert err == ["err 0"]
    assert (await anyio.Path(attempt, "0", "stdout.log").read_text()).startswith("out 0 0\n")
    assert not await anyio.Path(attempt, "0", "stderr.log").exists()
    assert await anyio.Path(attempt, "1", "stderr.log").read_text() == "err 1\n"


async def test_prefix_template_uses_global_rank(tmp_path: Path, backend: str) -> None:
    out, _, _ = await run_agent(
        {
            "n": 1,
            "log_dir": str(tmp_path),
            "tee": 1,
            "template": "[${role_name} g${rank} l${local_rank}] ",
        },
        backend,
    )
    assert "[default g10 l0] out 0 0" in out


async def test_devnull_disables_files_and_with_them_redirects_and_tee(backend: str) -> None:
    # torchrun's behaviour (tests/launcher/test_log_layout.py compares the two).
    cfg = {"n": 2, "log_dir": os.devnull, "tee": 1, "redirects": 2, "filter": [0]}
    out, err, attempt = await run_agent(cfg, backend)
    assert attempt == "None"
    text, errors = "\n".join(out), "\n".join(err)
    for rank in (0, 1):  # both ranks, the filter notwithstanding, unprefixed
        assert all(f"out {rank} {i}" in text for i in range(3))
        assert f"err {rank}" in errors
    assert "[default" not in text + errors


def test_attempt_dirs_are_never_reused(tmp_path: Path) -> None:
    run_dir = make_run_log_dir(str(tmp_path / "new"), "r/1")
    assert run_dir is not None and Path(run_dir).parent == tmp_path / "new"
    assert Path(run_dir).name.startswith("r_1_")  # torchrun's <run_id>_<random>
    a = LogDestinations.for_attempt(str(tmp_path), "r", 0, 1, Std.ALL, run_dir=run_dir)
    b = LogDestinations.for_attempt(str(tmp_path), "r", 0, 1, Std.ALL, run_dir=run_dir)
    c = LogDestinations.for_attempt(str(tmp_path), "r", 1, 1, Std.ALL, run_dir=run_dir)
    assert a.attempt_dir and b.attempt_dir and c.attempt_dir
    assert Path(a.attempt_dir) == Path(run_dir, "attempt_0")
    assert Path(b.attempt_dir) == Path(run_dir, "attempt_0_1")
    assert Path(c.attempt_dir) == Path(run_dir, "attempt_1")
    assert a.error_files[0] == os.path.join(a.attempt_dir, "0", "error.json")
    spec = a.process_spec(0, ["x"], {"A": "1"})
    assert spec.env["TORCHELASTIC_ERROR_FILE"] == a.error_files[0]
    assert spec.stdout_file == os.path.join(a.attempt_dir, "0", "stdout.log")
    assert make_run_log_dir(os.devnull, "r") is None


def test_each_agent_gets_its_own_run_dir(tmp_path: Path) -> None:
    first = make_run_log_dir(str(tmp_path), "job")
    second = make_run_log_dir(str(tmp_path), "job")
    assert first and second and first != second
    assert os.path.dirname(first) == os.path.dirname(second) == str(tmp_path)


def test_log_dir_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(WorkerStartError, match=r"cannot create a log directory.*--log-dir"):
        make_run_log_dir(str(tmp_path / "f"), "job")


def test_default_log_dir_is_one_temp_dir_per_run() -> None:
    a = LogDestinations.for_attempt(None, "tmp-run", 0, 1)
    b = LogDestinations.for_attempt(None, "tmp-run", 1, 1)
    assert a.attempt_dir and b.attempt_dir
    assert os.path.dirname(a.attempt_dir) == os.path.dirname(b.attempt_dir)
    assert "aelastic_" in a.attempt_dir
    assert os.path.basename(os.path.dirname(a.attempt_dir)).startswith("tmp-run_")


def test_std_parsing() -> None:
    assert Std.from_str("3") is Std.ALL
    assert Std.from_str("0:3,1:0") == {0: Std.ALL, 1: Std.NONE}
    assert parse_std_spec("1", 2) == {0: Std.OUT, 1: Std.OUT}
    assert parse_std_spec("1:2", 3) == {0: Std.NONE, 1: Std.ERR, 2: Std.NONE}
    with pytest.raises(ValueError, match='"0:3,1:0"'):
        parse_std_spec("4", 2)
    with pytest.raises(ValueError, match=r"only local ranks 0\.\.1"):
        parse_std_spec("5:1", 2)
    with pytest.raises(ValueError, match="twice"):
        parse_std_spec("0:1,0:2", 2)
    with pytest.raises(ValueError, match="local ranks filter"):
        LogDestinations.for_attempt(os.devnull, "r", 0, 2, local_ranks_filter={3})
    with pytest.raises(ValueError, match="template"):
        LogDestinations.for_attempt(os.devnull, "r", 0, 1, tee=Std.ALL, prefix_template="${nope}")
