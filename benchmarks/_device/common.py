"""Shared by the device check's pieces: CPU mode, GPU memory per pid, processes, JSON lines.

``DEVICE_CHECK_CPU=1`` swaps ``cuda`` for ``cpu`` and ``nccl`` for ``gloo`` and shrinks
the model, so every piece's plumbing runs on a machine without a GPU.

GPU memory per process comes from ``nvidia-smi --query-compute-apps=pid,used_memory
--format=csv`` (:func:`parse_compute_apps` parses it, :func:`gpu_memory_by_pid` runs it);
a process that holds no CUDA context is not listed. Inside a container nvidia-smi may
list host pids, so :func:`nvidia_device_fds` is the cross-check: a process with a CUDA
context on a device holds that device's file (``/dev/nvidia<N>``) open.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

CPU = os.environ.get("DEVICE_CHECK_CPU", "") not in ("", "0")
DEVICE = "cpu" if CPU else "cuda"
BACKEND = "gloo" if CPU else "nccl"
PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))


def parse_compute_apps(csv_text: str) -> dict[int, int]:
    """``{pid: MiB}`` from ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv``.

    The header line is skipped; ``used_memory`` reads ``1234 MiB`` (``[N/A]`` counts as
    0); a pid listed twice (one process on two GPUs) gets the sum. Raises ValueError on
    a line that is neither.
    """
    out: dict[int, int] = {}
    for line in csv_text.splitlines():
        line = line.strip()
        if not line or line.lower().startswith("pid"):
            continue
        pid_text, _, mem_text = line.partition(",")
        mem_text = mem_text.strip()
        if not pid_text.strip().isdigit() or not mem_text:
            raise ValueError(f"not a compute-apps line: {line!r}")
        mib = 0 if mem_text.startswith("[") else int(mem_text.split()[0])
        out[int(pid_text)] = out.get(int(pid_text), 0) + mib
    return out


def gpu_memory_by_pid(nvidia_smi: str = "nvidia-smi") -> dict[int, int] | None:
    """``{pid: MiB}`` of every process with a CUDA context, or None without nvidia-smi."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return None
    done = subprocess.run(
        [exe, "--query-compute-apps=pid,used_memory", "--format=csv"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return parse_compute_apps(done.stdout)


def gpu_memory_of(pids: Iterable[int], table: dict[int, int] | None) -> dict[int, int | None]:
    """``{pid: MiB}`` for ``pids``: 0 when nvidia-smi does not list it, None without a table."""
    return {pid: (None if table is None else table.get(pid, 0)) for pid in pids}


def nvidia_device_fds(pid: int) -> int:
    """How many ``/dev/nvidia<N>`` (a GPU, not nvidiactl/uvm) files ``pid`` holds open."""
    count = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia") and target[len("/dev/nvidia") :].isdigit():
            count += 1
    return count


def maps_library(pid: int, name: str) -> bool:
    """Whether ``pid`` has a file whose name contains ``name`` mapped (``/proc/<pid>/maps``)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(name in line for line in f)
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc/<n>/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def idle_interpreters(launcher_pid: int, workers: Iterable[int]) -> list[int]:
    """The launcher's idle warm interpreters (``_warm_boot.py`` processes, not workers)."""
    busy = set(workers)
    out = []
    for pid in descendants(launcher_pid):
        if pid in busy:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_warm_boot.py" in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def record(path: str, **fields: object) -> None:
    """Append one JSON line to ``path`` (one ``O_APPEND`` write: whole even if we die)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps({"t": time.time(), **fields}) + "\n").encode())
    finally:
        os.close(fd)


def records(path: str) -> list[dict[str, object]]:
    """The complete JSON lines of ``path`` (none when it does not exist yet)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_for(
    path: str, event: str, deadline: float, proc: subprocess.Popen[bytes]
) -> dict[str, Any]:
    """The first record of ``event`` in ``path``; RuntimeError past ``deadline`` or on exit."""
    while time.monotonic() < deadline:
        for r in records(path):
            if r.get("event") == event:
                return r
        if proc.poll() is not None:
            break
        time.sleep(0.05)  # a benchmark waiting on another process's file
    for r in records(path):
        if r.get("event") == event:
            return r
    raise RuntimeError(f"no {event!r} record in {path} (launcher exit code {proc.poll()})")
