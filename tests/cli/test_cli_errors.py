"""``aelastic run`` in-process: bad flags exit 2 with one line; --help exits 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aelastic.launcher._cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["--nnodes", "3:2", "x.py"],
        ["--nproc-per-node", "x", "x.py"],
        ["--rdzv-conf", "foo", "x.py"],
        ["--max-restarts", "-1", "x.py"],
        ["-m", "--no-python", "mod"],
        [],
        ["--no-such-flag", "x.py"],
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == ""
    assert len(lines) == 1, err
    assert lines[0].startswith("aelastic run: error: ")
    assert "Traceback" not in err


def test_help_lists_every_torchrun_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--nnodes",
        "--nproc-per-node",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
        "--rdzv-conf",
        "--standalone",
        "--max-restarts",
        "--monitor-interval",
        "--start-method",
        "--event-log-handler",
        "--role",
        "--module",
        "--no-python",
        "--run-path",
        "--log-dir",
        "--redirects",
        "--tee",
        "--local-ranks-filter",
        "--duplicate-stdout-filters",
        "--duplicate-stderr-filters",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--local-addr",
        "--logs-specs",
        "--numa-binding",
        "--signals-to-handle",
        "--shutdown-timeout",
        "--virtual-local-rank",
        "--exit-barrier-timeout",
    ):
        assert flag in out, flag


def test_pet_error_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "many")
    assert main(["x.py"]) == 2
    assert "PET_NPROC_PER_NODE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--standalone", "/nonexistent/train.py"],
        ["--standalone", "--no-python", "/nonexistent/bin/tool"],
        ["--standalone", "--no-python", "no-such-command-on-path-xyz"],
    ],
)
def test_missing_script_exits_2_before_starting(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "/nonexistent" in err[0] or "no-such-command" in err[0]


def test_unknown_event_destination_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--standalone", "--event-log-handler", "nope", __file__]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nope'" in err[0]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--rdzv-backend", "nope", "--rdzv-endpoint", "127.0.0.1:1"], "'nope'"),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", "a b"], "a b"),
        (["--rdzv-backend", "c10d", "--rdzv-conf", "heartbeat_timeout=x"], "heartbeat_timeout"),
    ],
)
def test_bad_rendezvous_settings_exit_2(
    flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*flags, __file__]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_help_states_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    # One block per option: from a line starting with "  -" to the next one.
    blocks = re.split(r"\n(?=  -)", out)
    for block in blocks:
        text = " ".join(block.split()).replace("(default: default)", "")
        assert text.count("default") <= 1, text
        assert "(default: )" not in text and "(default: None)" not in text, text
    assert "(default: 1:1)" in out  # defaults are still shown


def test_logs_specs_no_plugin_provides_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "started"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["--standalone", "--logs-specs", "nope", str(script)]) == 2
    assert "--logs-specs 'nope': no installed package provides it" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("flag", "path", "needle"),
    [
        ("--checkpoint-dir", "file/ckpt", "not a writable directory"),
        ("--job-secret-file", "missing", "cannot read the job secret"),
        ("--job-secret-file", "empty", "the job secret file is empty"),
    ],
)
def test_unusable_checkpoint_paths_exit_2_before_starting(
    flag: str, path: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The files are checked when the job starts (not while parsing): still exit 2 with
    one line naming the flag and the fix, and no worker started."""
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").write_text("")
    marker = tmp_path / "started"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    bad = str(tmp_path / path)
    assert main(["--standalone", flag, bad, str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"aelastic run: error: {flag} {bad}: {needle}"), err
    assert not marker.exists()
