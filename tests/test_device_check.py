"""The device check's CPU-testable parts (``benchmarks/device_check.sh``).

GPU memory per pid is read from ``nvidia-smi``; a fake ``nvidia-smi`` on ``PATH`` (the
only stand-in: it is the seam between the check and the driver) prints what the real
one prints. The hang piece runs for real in the CPU mode (gloo, no GPU).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parent.parent / "benchmarks" / "_device"
sys.path.insert(0, str(DEVICE))

from common import gpu_memory_by_pid, gpu_memory_of, parse_compute_apps  # noqa: E402

#: What ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv`` printed on a
#: two-GPU machine: pid 4242 on both GPUs, one process whose usage the driver hides.
COMPUTE_APPS = """\
pid, used_memory [MiB]
4242, 1536 MiB
4243, 802 MiB
4242, 512 MiB
4250, [N/A]
"""


def _fake_nvidia_smi(bin_dir: Path, output: str) -> None:
    """An ``nvidia-smi`` that checks it was asked the one query and prints ``output``."""
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-compute-apps=pid,used_memory" ] && [ "$2" = "--format=csv" ]'
        " || exit 9\n"
        f"cat <<'EOF'\n{output}EOF\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_parse_compute_apps() -> None:
    assert parse_compute_apps(COMPUTE_APPS) == {4242: 2048, 4243: 802, 4250: 0}
    assert parse_compute_apps("pid, used_memory [MiB]\n") == {}  # no process holds a context
    with pytest.raises(ValueError, match="not a compute-apps line"):
        parse_compute_apps("No devices were found")


def test_gpu_memory_per_pid_through_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(tmp_path / "bin", COMPUTE_APPS)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    table = gpu_memory_by_pid()
    assert table == {4242: 2048, 4243: 802, 4250: 0}
    # An idle interpreter holding no CUDA context is not listed: 0 MiB.
    assert gpu_memory_of([4243, 77], table) == {4243: 802, 77: 0}


def test_without_nvidia_smi_nothing_is_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_memory_by_pid() is None
    assert gpu_memory_of([77], None) == {77: None}


def test_the_hang_piece_runs_on_the_cpu(tmp_path: Path) -> None:
    """gloo instead of NCCL: detected, stacks naming the hung function, and torch's flight
    recorder beside them, named in the failure."""
    # the interpreter running the tests (with torch), whatever python3 is on PATH
    env = {**os.environ, "DEVICE_CHECK_CPU": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    script = DEVICE.parent / "device_check.sh"
    done = subprocess.run(
        ["bash", str(script), "--only", "hang/nccl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "device_check.json").read_text())["results"]["hang/nccl"]
    assert result["stacks_name_it"] and result["fr_in_failure"]
    assert result["fr_entries"] == 6 and result["fr_last"].startswith("gloo:all_reduce")
    assert "| hang/nccl | yes |" in (tmp_path / "device_check.md").read_text()
