"""Bad input to aelastic.checkpoint: one clear error each, the previous step intact."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aelastic import CheckpointSettings, ConfigError, LaunchConfig
from aelastic.checkpoint import CheckpointError
from aelastic.checkpoint._disk import check_paths, check_writable
from aelastic.launcher._args import UsageError, build_parser, parse_run_args

SCRIPT = str(Path(__file__).parent / "scripts" / "bad_input.py")


def test_bad_input_raises_one_clear_error_and_keeps_the_last_step(tmp_path: Path) -> None:
    env = {**os.environ, "AELASTIC_CHECKPOINT_DIR": str(tmp_path), "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run(
        [sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    out = json.loads(done.stdout)
    assert "cannot serialize rank 0's object of step 6" in out["unpicklable"]
    assert "step 4 is lower than step 5" in out["lower"]
    assert "needs about 1024.0 TiB" in out["memory"] and "is free in" in out["memory"]
    assert "step=-1" in out["bad_step"]
    assert "MemoryWriter: step 4 is lower than step 5" in out["dcp_lower"]
    assert "cannot serialize rank 0's object of step 6" in out["async_unpicklable"]
    assert "Not a directory" in out["not_writable"]
    assert "aelastic run" in out["outside"]
    assert out["load_outside"] is None
    assert out["intact"] and out["intact_after_all"]
    assert out["saved"] == [[0.0, 1.0, 2.0, 3.0], "ok"]


def test_checkpoint_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match="ckpt: not a writable directory"):
        check_writable(str(blocker / "ckpt"))


def test_checkpoint_flags_reach_the_config_or_exit_2(tmp_path: Path) -> None:
    disk = tmp_path / "ckpt"
    config = parse_run_args(
        ["--checkpoint-dir", str(disk), "--checkpoint-persist-interval", "30", "x.py"], {}
    ).config
    assert (config.checkpoints.dir, config.checkpoints.persist_interval) == (str(disk), 30.0)
    # parsing touches no file: the directory is made when the job starts
    # (tests/cli/test_cli_errors.py: an unusable one exits 2 there)
    assert not disk.exists()
    assert parse_run_args(["x.py"], {}).config.checkpoints == CheckpointSettings()
    # the range is CheckpointSettings' (test_checkpoint_settings.py); the type is the flag's
    with pytest.raises(UsageError, match="--checkpoint-persist-interval 0: need seconds > 0"):
        parse_run_args(["--checkpoint-persist-interval", "0", "x.py"], {})
    with pytest.raises(UsageError, match="--checkpoint-persist-interval 'soon': expected a"):
        parse_run_args(["--checkpoint-persist-interval", "soon", "x.py"], {})


def test_checkpoint_peer_copies_flag_reaches_the_config_or_exit_2() -> None:
    assert parse_run_args(["x.py"], {}).config.checkpoints.peer_copies == 1
    parsed = parse_run_args(["--checkpoint-peer-copies", "0", "x.py"], {})
    assert parsed.config.checkpoints.peer_copies == 0
    # the range is CheckpointSettings' (one message for the flag and the API)
    with pytest.raises(UsageError, match="--checkpoint-peer-copies -1: need a whole number >= 0"):
        parse_run_args(["--checkpoint-peer-copies", "-1", "x.py"], {})
    with pytest.raises(UsageError, match="--checkpoint-peer-copies 'two': expected an integer"):
        parse_run_args(["--checkpoint-peer-copies", "two", "x.py"], {})
    with pytest.raises(ConfigError, match="--checkpoint-peer-copies -2: need a whole number >= 0"):
        CheckpointSettings(peer_copies=-2)


def test_the_old_checkpoint_replicas_flag_still_means_peer_copies() -> None:
    """``--checkpoint-replicas`` (and ``PET_CHECKPOINT_REPLICAS``) is the documented old
    name of ``--checkpoint-peer-copies``: the same config, checked the same way."""

    def config(argv: list[str], env: dict[str, str]) -> LaunchConfig:
        config = parse_run_args([*argv, "x.py"], env).config
        return dataclasses.replace(config, run_id="same")  # standalone: a fresh id each

    for n in ("0", "3"):
        new = config(["--checkpoint-peer-copies", n], {})
        assert new.checkpoints.peer_copies == int(n)
        assert config(["--checkpoint-replicas", n], {}) == new
        assert config([], {"PET_CHECKPOINT_REPLICAS": n}) == new
        assert config([], {"PET_CHECKPOINT_PEER_COPIES": n}) == new
    # the command line wins over either variable, as for every flag
    assert config(["--checkpoint-replicas", "2"], {"PET_CHECKPOINT_REPLICAS": "5"}) == config(
        ["--checkpoint-peer-copies", "2"], {}
    )
    with pytest.raises(UsageError, match="--checkpoint-replicas -1: must be >= 0"):
        config(["--checkpoint-replicas", "-1"], {})
    with pytest.raises(UsageError, match="PET_CHECKPOINT_REPLICAS 'x': expected an integer"):
        config([], {"PET_CHECKPOINT_REPLICAS": "x"})
    both = "--checkpoint-peer-copies and --checkpoint-replicas are the same setting"
    with pytest.raises(UsageError, match=both):
        config(["--checkpoint-peer-copies", "1", "--checkpoint-replicas", "1"], {})
    with pytest.raises(UsageError, match="PET_CHECKPOINT_PEER_COPIES and --checkpoint-replicas"):
        config(["--checkpoint-replicas", "1"], {"PET_CHECKPOINT_PEER_COPIES": "1"})
    helptext = build_parser().format_help()
    assert "--checkpoint-peer-copies" in helptext
    assert "the old name of --checkpoint-peer-copies" in " ".join(helptext.split())


def test_script_options_that_look_like_launcher_options_stay_the_scripts() -> None:
    parsed = parse_run_args(
        ["--nproc-per-node", "2", "--max-restarts=1", "-r", "3", "train.py", "--checkpoint",
         "c.bin", "--checkpoint-dir", "d", "--nnodes", "4"],
        {},
    )  # fmt: skip
    assert parsed.config.nproc_per_node == 2 and parsed.config.max_restarts == 1
    assert parsed.config.checkpoints.dir is None and parsed.config.max_nodes == 1
    assert parsed.script == "train.py"
    script_args = ["--checkpoint", "c.bin", "--checkpoint-dir", "d", "--nnodes", "4"]
    assert parsed.args[-7:] == ["train.py", *script_args]


def test_dcp_classes_without_torch_raise_one_clear_error() -> None:
    # torch made unimportable (a None entry in sys.modules): the agent's side imports
    # aelastic.checkpoint without it, and only the DCP classes need it
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from aelastic import checkpoint\n"
        "try:\n"
        "    checkpoint.MemoryWriter\n"
        "except checkpoint.CheckpointError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "aelastic.checkpoint.MemoryWriter needs torch" in done.stdout, done
    assert "install torch" in done.stdout


def test_job_secret_file_flag_reaches_the_config_or_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AELASTIC_JOB_SECRET_FILE", raising=False)
    assert parse_run_args(["x.py"], {}).config.checkpoints.job_secret_file is None
    secret = tmp_path / "secret"
    secret.write_text("abc\n")
    parsed = parse_run_args(["--job-secret-file", str(secret), "x.py"], {})
    assert parsed.config.checkpoints.job_secret_file == str(secret)
    from_pet = parse_run_args(["x.py"], {"PET_JOB_SECRET_FILE": str(secret)})
    assert from_pet.config.checkpoints.job_secret_file == str(secret)
    from_ours = parse_run_args(["x.py"], {"AELASTIC_JOB_SECRET_FILE": str(secret)})
    assert from_ours.config.checkpoints.job_secret_file == str(secret)
    # the parser reads the environment it is handed, not its own process's (it read
    # os.environ for this one variable before)
    monkeypatch.setenv("AELASTIC_JOB_SECRET_FILE", str(secret))
    assert parse_run_args(["x.py"], {}).config.checkpoints.job_secret_file is None
    assert parse_run_args(["x.py"]).config.checkpoints.job_secret_file == str(secret)
    monkeypatch.delenv("AELASTIC_JOB_SECRET_FILE")
    # the file is read when the job starts, not while parsing (check_paths below)
    missing = str(tmp_path / "missing")
    assert parse_run_args(["x.py"], {"PET_JOB_SECRET_FILE": missing}).config.checkpoints == (
        CheckpointSettings(job_secret_file=missing)
    )


def test_check_paths_makes_the_directory_and_reads_the_secret(tmp_path: Path) -> None:
    disk, secret = tmp_path / "a" / "ckpt", tmp_path / "secret"
    secret.write_text("abc\n")
    check_paths(CheckpointSettings(dir=str(disk), job_secret_file=str(secret)))
    assert disk.is_dir() and os.listdir(disk) == []  # the probe file is gone
    (tmp_path / "file").write_text("")
    bad_dir = CheckpointSettings(dir=str(tmp_path / "file" / "d"))
    with pytest.raises(CheckpointError, match=r"^--checkpoint-dir .*not a writable directory"):
        check_paths(bad_dir)
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(CheckpointError, match=r"^--job-secret-file .*the job secret file is empty"):
        check_paths(CheckpointSettings(job_secret_file=str(empty)))
    with pytest.raises(CheckpointError, match=r"^--job-secret-file .*cannot read the job secret"):
        check_paths(CheckpointSettings(job_secret_file=str(tmp_path / "missing")))
