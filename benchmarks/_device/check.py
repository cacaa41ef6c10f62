"""The device check: aelastic's CUDA paths on one GPU, in one run, printed as a table.

    bash benchmarks/device_check.sh             # on a GPU machine (see that script)
    DEVICE_CHECK_CPU=1 bash benchmarks/device_check.sh   # the plumbing, on the CPU

Runs, one after the other, each with its own deadline inside a total budget
(``DEVICE_CHECK_BUDGET``, default 450 s; a piece that would start past it is
reported as skipped):

1. ``restart/<launcher>``: ``train_job.py`` (an MLP of a few hundred MB with AdamW,
   NCCL at world size 1, a checkpoint in memory every 5 steps) crashes before step 6;
   crash -> first step of the restarted worker, for ``aelastic --preload auto``,
   ``aelastic`` and ``torchrun`` (``--standalone --nproc-per-node 1 --max-restarts 1``).
   With preload, while the restarted worker trains: the idle warm interpreters'
   GPU memory (``nvidia-smi`` per pid) and ``/dev/nvidia<N>`` files, and whether the
   restarted worker found torch imported, CUDA not initialised, and its first CUDA
   call working.
2. ``checkpoint``: ``ckpt_job.py``: ``aelastic.checkpoint.save`` of the CUDA state vs
   ``torch.save`` to tmpfs vs the pinned-copy floor; the restored tensors' devices.
3. ``hang/cuda-sync`` and ``hang/nccl``: ``hang_job.py`` under aelastic with a 3 s
   heartbeat timeout: detected, stacks written and naming the hung function, and for
   NCCL torch's flight recorder dump beside them (written before the kill: the worker
   writes it, and it is dead after). The NCCL run's process group comes from
   aelastic's worker store (``init_process_group("nccl")``).

Writes ``device_check.json`` (every figure) and the table (``device_check.md``) to
``--out``; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from common import (
    CPU,
    HERE,
    PY,
    gpu_memory_by_pid,
    gpu_memory_of,
    idle_interpreters,
    maps_library,
    nvidia_device_fds,
    records,
    wait_for,
)

ROOT = os.path.dirname(os.path.dirname(HERE))
HIDDEN, LAYERS = (256, 2) if CPU else (4096, 4)
COMMON = ["--standalone", "--nproc-per-node", "1", "--max-restarts", "1"]
LAUNCHERS = {
    "aelastic --preload auto": [PY, "-m", "aelastic", "run", *COMMON, "--preload", "auto"],
    "aelastic": [PY, "-m", "aelastic", "run", *COMMON],
    "torchrun": [PY, "-m", "torch.distributed.run", *COMMON],
}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def deadline(self, seconds: float) -> float:
        return min(time.monotonic() + seconds, self.end)

    def left(self) -> float:
        return self.end - time.monotonic()


def _start(argv: list[str], env: dict[str, str], err: str) -> subprocess.Popen[bytes]:
    with open(err, "wb") as f:
        return subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def _finish(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The exit code, or None when it had to be killed at ``deadline`` (with its group)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return None


def _tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return ""


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def memory_root(state_bytes: int) -> tuple[str | None, str]:
    """Where checkpoints in memory go: /dev/shm when it has room for three copies."""
    need = 3 * state_bytes
    with contextlib.suppress(OSError):
        if shutil.disk_usage("/dev/shm").free > need:
            return None, "/dev/shm"
    path = tempfile.mkdtemp(prefix="device_check_ckpt_")
    return path, f"{path} (/dev/shm has less than {need >> 20} MiB free)"


def restart(name: str, work: str, env: dict[str, str], budget: Budget) -> dict[str, Any]:
    out = os.path.join(work, "out.jsonl")
    tmpfs = env.get("AELASTIC_CHECKPOINT_MEMORY_ROOT", "/dev/shm")
    ckpt = os.path.join(tmpfs, f"device_check_{os.getpid()}.pt")
    job = [os.path.join(HERE, "train_job.py"), "--out", out, "--ckpt", ckpt]
    job += ["--hidden", str(HIDDEN), "--layers", str(LAYERS)]
    err = os.path.join(work, "launcher.log")
    proc = _start([*LAUNCHERS[name], *job], env, err)
    result: dict[str, Any] = {}
    try:
        resumed = wait_for(out, "resumed", budget.deadline(150), proc)
        evs = records(out)
        workers = [int(e["pid"]) for e in evs if e["event"] == "top"]
        if "preload" in name:
            result.update(_idle_gpu(proc.pid, workers, budget))
        open(f"{out}.release", "w").close()
        code = _finish(proc, budget.deadline(120))
    finally:
        if proc.poll() is None:
            _finish(proc, 0)
        with contextlib.suppress(OSError):
            os.remove(ckpt)
    evs = records(out)
    crash = next(e for e in evs if e["event"] == "crash")
    first = next(e for e in evs if e["event"] == "step" and e["attempt"] == 1)
    top1 = next(e for e in evs if e["event"] == "top" and e["attempt"] == 1)
    cuda1 = next(e for e in evs if e["event"] == "cuda" and e["attempt"] == 1)
    pgs = [e for e in evs if e["event"] == "pg"]
    result.update(
        code=code,
        restart_s=first["t"] - crash["t"],
        resumed_step=resumed["step"],
        torch_preloaded=top1["preloaded"],
        cuda_at_top=top1["cuda_at_top"],
        first_cuda_s=cuda1["seconds"],
        first_cuda_ok=cuda1["ok"],
        init_pg_s=[round(e["seconds"], 3) for e in pgs],
        agent_store=[e["store"] for e in pgs],
    )
    result["ok"] = code == 0 and result["resumed_step"] == 5 and all(e["ok"] for e in pgs)
    if "preload" in name:
        result["ok"] &= bool(top1["preloaded"]) and not top1["cuda_at_top"] and cuda1["ok"]
        result["ok"] &= bool(result["idle_pids"]) and all(result["idle_torch_loaded"])
        result["ok"] &= not any(result["idle_gpu_mib"].values())
        result["ok"] &= not any(result["idle_device_files"].values())
    return result


def _idle_gpu(launcher: int, workers: list[int], budget: Budget) -> dict[str, Any]:
    """The idle warm interpreters' GPU footprint, once they imported torch (<= 20 s)."""
    deadline = budget.deadline(20)
    idle = idle_interpreters(launcher, workers)
    while time.monotonic() < deadline and not (
        idle and all(maps_library(p, "libtorch") for p in idle)
    ):
        time.sleep(0.2)  # the replacement interpreter is still starting or importing
        idle = idle_interpreters(launcher, workers)
    try:
        table, smi_error = gpu_memory_by_pid(), None
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        table, smi_error = None, f"{type(exc).__name__}: {exc}"
    out: dict[str, Any] = {
        "idle_pids": idle,
        "idle_torch_loaded": [maps_library(p, "libtorch") for p in idle],
        "idle_gpu_mib": gpu_memory_of(idle, table),
        "idle_device_files": {p: nvidia_device_fds(p) for p in idle},
        "idle_libcuda_loaded": [maps_library(p, "libcuda.so") for p in idle],
        # nvidia-smi inside a container may list host pids: then the worker shows 0 too.
        "worker_gpu_mib": gpu_memory_of(workers[-1:], table),
        "worker_device_files": nvidia_device_fds(workers[-1]),
    }
    if smi_error:
        out["nvidia_smi_error"] = smi_error
    return out


def checkpoint(work: str, env: dict[str, str], budget: Budget) -> dict[str, Any]:
    out = os.path.join(work, "out.jsonl")
    tmp = env.get("AELASTIC_CHECKPOINT_MEMORY_ROOT", "/dev/shm")
    argv = [*LAUNCHERS["aelastic"], os.path.join(HERE, "ckpt_job.py"), "--out", out, "--tmp", tmp]
    argv += ["--hidden", str(HIDDEN), "--layers", str(LAYERS)]
    err = os.path.join(work, "launcher.log")
    code = _finish(_start(argv, env, err), budget.deadline(150))
    save = next(e for e in records(out) if e["event"] == "save")
    load = next(e for e in records(out) if e["event"] == "load")
    result = {"code": code, **{k: v for k, v in save.items() if k not in ("t", "event")}}
    result.update(devices=load["devices"], mapped_devices=load["mapped_devices"])
    result["ok"] = (
        code == 0 and load["step"] == 3 and load["mapped_devices"] == ["cpu" if CPU else "cuda:0"]
    )
    return result


def hang(mode: str, work: str, env: dict[str, str], budget: Budget) -> dict[str, Any]:
    out = os.path.join(work, "out.jsonl")
    logs = os.path.join(work, "logs")
    argv = [PY, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "1"]
    argv += ["--max-restarts", "0", "--heartbeat-timeout", "3"]
    argv += ["--initial-heartbeat-timeout", "120", "--log-dir", logs]
    argv += [os.path.join(HERE, "hang_job.py"), "--out", out, "--mode", mode]
    err = os.path.join(work, "launcher.log")
    code = _finish(_start(argv, env, err), budget.deadline(120))
    evs = records(out)
    hanging = next(e for e in evs if e["event"] == "hanging")
    ready = next(e for e in evs if e["event"] == "ready")
    (rank_dir,) = [
        os.path.join(root, "0") for root, dirs, _ in os.walk(logs) if root.endswith("attempt_0")
    ]
    stacks = os.path.join(rank_dir, "stacks.txt")
    fr = os.path.join(rank_dir, "nccl_trace_rank_0")
    log = _read(err)
    late = re.search(r"noticed ([\d.]+) ms after the deadline", log)
    func = "hung_in_nccl_all_reduce" if mode == "nccl" else "hung_in_cuda_synchronize"
    result: dict[str, Any] = {
        "code": code,
        "late_ms": float(late.group(1)) if late else None,
        "stacks_s": os.path.getmtime(stacks) - hanging["t"] if os.path.exists(stacks) else None,
        "stacks_name_it": func in _read(stacks),
        "pg_s": ready["pg_seconds"],
    }
    if mode == "nccl":
        result["fr_s"] = os.path.getmtime(fr) - hanging["t"] if os.path.exists(fr) else None
        entries: list[dict[str, Any]] = []
        if os.path.exists(fr):
            with open(fr, "rb") as f:
                entries = pickle.load(f).get("entries", [])
        result["fr_entries"] = len(entries)
        result["fr_last"] = (
            f"{entries[-1]['profiling_name']} {entries[-1]['state']}" if entries else None
        )
        result["fr_in_failure"] = "torch's flight recorder:" in log
    result["ok"] = (
        code not in (0, None)
        and result["late_ms"] is not None
        and bool(result["stacks_name_it"])
        and (mode != "nccl" or (result["fr_entries"] > 0 and result["fr_in_failure"]))
    )
    return result


def _machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "mode": "CPU dry run (DEVICE_CHECK_CPU=1)" if CPU else "GPU",
    }
    if shutil.which("nvidia-smi"):
        q = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        info["gpu"] = subprocess.run(q, capture_output=True, text=True, check=False).stdout.strip()
    with open("/proc/loadavg") as f:
        info["loadavg"] = f.read().strip()
    return info


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def table(machine: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    lines = ["machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), ""]
    lines += ["| check | ok | figures |", "|---|---|---|"]
    for name, r in results.items():
        ok = {True: "yes", False: "**NO**"}.get(r.get("ok"), str(r.get("ok")))
        figures = "; ".join(f"{k} {_fmt(v)}" for k, v in r.items() if k != "ok")
        lines.append(f"| {name} | {ok} | {figures} |")
    return "\n".join(lines) + "\n"


def time_work(work: str, env: dict[str, str], budget: Budget) -> dict[str, Any]:
    argv = [PY, os.path.join(ROOT, "benchmarks", "_hook_cost_worker.py"), "--rounds", "2"]
    argv += ["--iterations", "100", "--hidden", str(HIDDEN), "--bucket-mb", "25"]
    argv += ["--device", "cpu" if CPU else "cuda"]
    err = os.path.join(work, "launcher.log")
    code = _finish(_start(argv, env, err), budget.deadline(120))
    lines = [line for line in _read(err).splitlines() if line.startswith("{")]
    found = json.loads(lines[-1]) if code == 0 and lines else {}
    result: dict[str, Any] = {"code": code, **found}
    fraction = found.get("work_fraction")
    result["ok"] = code == 0 and fraction is not None and 0.5 < fraction <= 1.0
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None, help="where device_check.json/.md go")
    p.add_argument("--only", nargs="*", default=None, help="run only checks starting so")
    opts = p.parse_args()
    budget = Budget(float(os.environ.get("DEVICE_CHECK_BUDGET", "450")))
    state_bytes = LAYERS * HIDDEN * (HIDDEN + 1) * 4 * 3  # parameters, two AdamW moments
    root, where = memory_root(state_bytes)
    env = {**os.environ}
    env.pop("OMP_NUM_THREADS", None)
    if root:
        env["AELASTIC_CHECKPOINT_MEMORY_ROOT"] = root
    machine = {**_machine(), "checkpoints in": where, "state MiB": state_bytes >> 20}
    print("device check:", json.dumps(machine), flush=True)
    pieces: dict[str, Callable[[str], dict[str, Any]]] = {
        **{f"restart/{n}": (lambda w, n=n: restart(n, w, env, budget)) for n in LAUNCHERS},
        "checkpoint": lambda w: checkpoint(w, env, budget),
        "hang/cuda-sync": lambda w: hang("cuda-sync", w, env, budget),
        "hang/nccl": lambda w: hang("nccl", w, env, budget),
        "stragglers/time_work": lambda w: time_work(w, env, budget),
    }
    results: dict[str, dict[str, Any]] = {}
    work_root = tempfile.mkdtemp(prefix="device_check_")
    for name, piece in pieces.items():
        if opts.only is not None and not any(name.startswith(o) for o in opts.only):
            continue
        if budget.left() < 30:
            results[name] = {"ok": "skipped", "why": "total budget spent"}
            continue
        work = os.path.join(work_root, name.replace("/", "_").replace(" ", "_"))
        os.makedirs(work)
        t = time.monotonic()
        try:
            results[name] = piece(work)
        except Exception as exc:  # one failed piece must not hide the others
            why = f"{type(exc).__name__}: {exc}"
            results[name] = {"ok": False, "error": why, "log": _tail(f"{work}/launcher.log")}
        results[name]["wall_s"] = round(time.monotonic() - t, 1)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    text = table(machine, results)
    print("\n" + text)
    if opts.out:
        os.makedirs(opts.out, exist_ok=True)
        with open(os.path.join(opts.out, "device_check.json"), "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=1)
        with open(os.path.join(opts.out, "device_check.md"), "w") as f:
            f.write(text)
    if root:
        shutil.rmtree(root, ignore_errors=True)
    if os.environ.get("DEVICE_CHECK_KEEP"):
        print(f"device check: the runs' files are kept in {work_root}")
    else:
        shutil.rmtree(work_root, ignore_errors=True)
    raise SystemExit(0 if all(r.get("ok") is True for r in results.values()) else 1)


if __name__ == "__main__":
    main()
