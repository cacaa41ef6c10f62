"""@record error files, ProcessFailure and ChildFailedError, and torch compatibility."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aelastic import AelasticError
from aelastic.errors import ChildFailedError, ProcessFailure, record


def raise_value_error() -> None:
    raise ValueError("bad batch size 0")


def test_record_writes_torch_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    before = int(time.time())
    with pytest.raises(ValueError, match="bad batch size"):
        record(raise_value_error)()
    data = json.loads(error_file.read_text())
    assert list(data) == ["message"]
    assert list(data["message"]) == ["message", "extraInfo"]
    assert data["message"]["message"] == "ValueError: bad batch size 0"
    extra = data["message"]["extraInfo"]
    assert list(extra) == ["py_callstack", "timestamp"]
    assert "Traceback (most recent call last)" in extra["py_callstack"]
    assert "raise_value_error" in extra["py_callstack"]
    assert isinstance(extra["timestamp"], str) and int(extra["timestamp"]) >= before


def test_record_without_env_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        record(raise_value_error)()
    assert list(tmp_path.iterdir()) == []


def test_record_passes_results_and_exit_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)

    def add(a: int, b: int = 1) -> int:
        return a + b

    def leave(code: int) -> None:
        sys.exit(code)

    assert record(add)(1, b=2) == 3
    assert record(leave)(0) is None
    with pytest.raises(SystemExit):
        record(leave)(2)


async def test_record_on_coroutine_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    @record
    async def main(fail: bool) -> str:
        if fail:
            raise KeyError("missing")
        return "ok"

    assert await main(False) == "ok"
    assert not error_file.exists()
    with pytest.raises(KeyError):
        await main(True)
    assert json.loads(error_file.read_text())["message"]["message"] == "KeyError: 'missing'"


def write_error(path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    def boom() -> None:
        raise exc

    with pytest.raises(type(exc)):
        record(boom)()


def test_process_failure_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error_file = tmp_path / "error.json"
    write_error(error_file, monkeypatch, RuntimeError("cuda oops"))
    with_file = ProcessFailure(local_rank=1, pid=123, exitcode=1, error_file=str(error_file))
    assert isinstance(with_file.message, dict)
    assert with_file.message["message"] == "RuntimeError: cuda oops"
    assert with_file.timestamp == int(with_file.message["extraInfo"]["timestamp"])
    assert with_file.signal_name() == "<N/A>"
    assert "RuntimeError: cuda oops" in with_file.traceback

    killed = ProcessFailure(0, 99, -9, str(tmp_path / "missing.json"), exit_time=1000.5)
    assert killed.error_file == "<N/A>"
    assert killed.signal_name() == "SIGKILL"
    assert killed.timestamp == 1000
    assert killed.message.startswith("Signal 9 (SIGKILL) received by PID 99")
    assert "OOM" in killed.message and "dmesg" in killed.message
    assert killed.timestamp_isoformat().count("_") == 1

    plain = ProcessFailure(0, 5, 2, None)
    assert plain.error_file_data["errorTraits"]["category"] == "system_terminated_error"
    assert "@aelastic.errors.record" in plain.message

    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    broken = ProcessFailure(0, 6, 1, str(garbage))
    assert "not in torch's error.json schema" in broken.message


def test_child_failed_error_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error_file = tmp_path / "error.json"
    write_error(error_file, monkeypatch, ValueError("loss is nan"))
    root = ProcessFailure(1, 4242, 1, str(error_file))
    later = ProcessFailure(0, 4241, -9, None, exit_time=root.timestamp + 5.0)
    err = ChildFailedError("train.py", {3: root, 2: later}, hostname="node-a.example")
    assert isinstance(err, AelasticError)
    assert err.get_first_failure() == (3, root)
    text = str(err)
    assert "train.py FAILED" in text
    head, _, root_part = text.partition("Root Cause (first observed failure):")
    # The root cause comes last; the other failure above it.
    assert "rank      : 3 (local_rank: 1)" in root_part
    assert "exitcode  : 1 (pid: 4242)" in root_part
    assert "ValueError: loss is nan" in root_part and "Traceback" in root_part
    assert "host      : node-a.example" in root_part
    assert "rank      : 2 (local_rank: 0)" in head
    assert "exitcode  : -9 (pid: 4241) (SIGKILL)" in head
    assert "OOM" in head
    assert text.rstrip().endswith("=" * 60)
    with pytest.raises(ValueError, match="at least one failure"):
        ChildFailedError("x", {})


def test_root_cause_within_a_second_is_the_earliest_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    write_error(first, monkeypatch, ValueError("first"))
    write_error(second, monkeypatch, ValueError("second"))
    stamp = int(json.loads(first.read_text())["message"]["extraInfo"]["timestamp"])
    for path, written in ((first, stamp + 0.2), (second, stamp + 0.1)):
        data = json.loads(path.read_text())
        data["message"]["extraInfo"]["timestamp"] = str(stamp)
        path.write_text(json.dumps(data))
        os.utime(path, (written, written))
    # Rank 0 wrote its file later but its process exited first: rank 1 is the root cause.
    early_exit = ProcessFailure(0, 10, -15, str(first), exit_time=stamp + 0.3)
    late_exit = ProcessFailure(1, 11, 1, str(second), exit_time=stamp + 0.9)
    err = ChildFailedError("train.py", {0: early_exit, 1: late_exit}, hostname="h")
    assert err.get_first_failure()[0] == 1
    assert late_exit.failure_time == pytest.approx(stamp + 0.1)


def test_record_copies_child_root_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child_file = tmp_path / "child.json"
    write_error(child_file, monkeypatch, ValueError("from the child"))
    failure = ProcessFailure(0, 1, -11, str(child_file))
    parent_file = tmp_path / "parent.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(parent_file))

    def agent_main() -> None:
        raise ChildFailedError("w", {0: failure}, hostname="h")

    with pytest.raises(ChildFailedError):
        record(agent_main)()
    data = json.loads(parent_file.read_text())
    assert data["message"]["message"] == "ValueError: from the child"
    assert data["message"]["errorCode"] == -11


def test_record_writes_nothing_for_a_root_cause_without_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's @record only logs here; the launcher's error file stays absent.
    parent_file = tmp_path / "parent.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(parent_file))

    def agent_main() -> None:
        raise ChildFailedError("w", {0: ProcessFailure(0, 1, -9, None)}, hostname="h")

    with pytest.raises(ChildFailedError):
        record(agent_main)()
    assert not parent_file.exists()


TORCH_CHECK = textwrap.dedent(
    """
    import json, sys
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError, ProcessFailure, record)
    ours, torch_file = sys.argv[1], sys.argv[2]
    f = ProcessFailure(local_rank=0, pid=7, exitcode=1, error_file=ours)
    text = ChildFailedError("train.py", {0: f}).format_msg()
    import os
    os.environ["TORCHELASTIC_ERROR_FILE"] = torch_file
    @record
    def main():
        raise KeyError("torch side")
    try:
        main()
    except KeyError:
        pass
    print(json.dumps({"message": f.message, "timestamp": f.timestamp, "text": text}))
    """
)


@pytest.mark.timeout(120)
def test_torch_reads_our_error_file_and_we_read_torchs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    ours = tmp_path / "ours.json"
    theirs = tmp_path / "theirs.json"
    write_error(ours, monkeypatch, ValueError("written by aelastic"))
    done = subprocess.run(
        [sys.executable, "-c", TORCH_CHECK, str(ours), str(theirs)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["message"]["message"] == "ValueError: written by aelastic"
    assert seen["timestamp"] == int(
        json.loads(ours.read_text())["message"]["extraInfo"]["timestamp"]
    )
    assert "ValueError: written by aelastic" in seen["text"]
    failure = ProcessFailure(0, 8, 1, str(theirs))
    assert failure.message["message"] == "KeyError: 'torch side'"
    assert "Traceback" in failure.traceback
