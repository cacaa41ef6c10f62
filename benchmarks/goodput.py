"""Goodput under faults, with the ledger's own figures next to the ground truth.

    python benchmarks/goodput.py [--duration 60] [--fault-every 30] [--compute-seconds 0.08]
                                 [--disk-every 50] [--only NAME ...] [--ledger-cost-only]

A 2-worker gloo DDP job (``_goodput_worker.py``: an MLP of 8 MiB, 16 MiB of state with
SGD's momentum; each step the real forward/backward/all-reduce plus
``--compute-seconds`` of sleep standing for the accelerator) runs for ``--duration``
seconds of wall time from the launch; the worker of rank 1 exits with ``os._exit(1)``
every ``--fault-every`` seconds (fixed wall times from the launch, whatever the restarts
cost). Launchers, one after the other (all ``--standalone --nproc-per-node 2
--max-restarts 100``)::

    ceiling          aelastic-memory without faults: the same job's best goodput
    aelastic-memory  python -m aelastic run --preload auto ...   aelastic.checkpoint.save
                                                                  every step
    torchrun-disk    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run
                     ...   torch.save (rank 0, local file) every --disk-every steps
    aelastic-disk    python -m aelastic run --preload auto ...   the same disk checkpoint
                     (separates the launcher's share from the checkpoint's)

Ground truth, from the workers' own records (rank 0: each step's number, end time and
duration): the goodput is the kept steps' time over the wall time (the kept steps: the
last run of each step up to the final one; a step's time runs from its start to its end,
its checkpoint included), and the re-run steps' time. Next to it, the ledger's figures
from aelastic's last stderr line (``aelastic: goodput R% of W s: ...``): its ratio, its
``productive`` and ``rollback``. Ratios are to torchrun-disk and to the ceiling.

Then the ledger's own cost (``--ledger-cost-only`` measures only that): the agent's CPU
per status write to compute its node's ledger, the bytes it adds to a status document
(the ledger rides on the status write: no store request of its own) and, at 256
simulated nodes, the extra bytes per second into the store and the reader's time to
combine the nodes' ledgers (``aelastic status``), against the job view's budget
(``benchmarks/jobview.py``: <= 2% of a core for the store at 1,000 nodes, which is per
request, and ``status`` <= 1 s at 256 nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _job_process import start_job

from aelastic.goodput import combine
from aelastic.goodput._categories import BADPUT
from aelastic.goodput._ledger import RankSteps
from aelastic.goodput._recorder import GoodputRecorder
from aelastic.jobview import summarize

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "_goodput_worker.py")
COMMON = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "100"]
AELASTIC = [PY, "-m", "aelastic", "run", *COMMON, "--preload", "auto"]
TORCHRUN = [PY, "-m", "torch.distributed.run", *COMMON]
LAUNCHERS = ("ceiling", "aelastic-memory", "torchrun-disk", "aelastic-disk")
_LINE = re.compile(r"aelastic: goodput ([\d.]+)% of ([\d.]+) s")
_PART = re.compile(r"(\w[\w.]*) ([\d.]+) s")


def ledger_line(err: list[str]) -> dict[str, float] | None:
    """The ledger from aelastic's last stderr line: ratio, wall and seconds per category."""
    for line in reversed(err):
        m = _LINE.search(line)
        if m:
            out = {"ratio": float(m.group(1)) / 100, "wall": float(m.group(2))}
            for name, value in _PART.findall(line.partition(": ")[2].partition(": ")[2]):
                out[name] = float(value)
            return out
    return None


def truth(events: list[dict[str, Any]], final: int) -> dict[str, float]:
    """Kept steps' time (the last run of each step up to ``final``) and re-run steps' time."""
    last: dict[int, float] = {}
    rerun = 0.0
    for e in events:
        if e["e"] == "step":
            if e["s"] in last:
                rerun += e["d"]
            last[e["s"]] = e["d"]
    return {"kept_s": sum(d for s, d in last.items() if s <= final), "rerun_s": rerun}


def run_once(name: str, opts: argparse.Namespace) -> dict[str, object]:
    argv = TORCHRUN if name.startswith("torchrun") else AELASTIC
    memory = name.endswith("memory") or name == "ceiling"
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    fault_every = 1e9 if name == "ceiling" else opts.fault_every
    with tempfile.TemporaryDirectory(prefix="goodput_") as d:
        out = os.path.join(d, "out.jsonl")
        t0 = time.time()
        job = [JOB, "--out", out, "--t0", repr(t0), "--duration", str(opts.duration)]
        job += ["--fault-every", str(fault_every)]
        job += ["--compute-seconds", str(opts.compute_seconds)]
        job += ["--checkpoint", "memory", "--every", "1"] if memory else []
        job += [] if memory else ["--checkpoint", "disk", "--every", str(opts.disk_every)]
        job += [] if memory else ["--path", os.path.join(d, "ckpt.pt")]
        err_path = os.path.join(d, "stderr.log")
        proc = start_job([*argv, *job], env, err_path)
        try:
            code = proc.wait(timeout=opts.duration + 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
            code = proc.wait()
        wall = time.time() - t0
        with open(out) as f:
            events = [json.loads(line) for line in f if line.endswith("\n")]
        with open(err_path, "rb") as f:
            err = f.read().decode(errors="replace").strip().splitlines()
    final = [e for e in events if e["e"] == "final"]
    starts = [e for e in events if e["e"] == "start"]
    result: dict[str, object] = {
        "code": code,
        "wall": round(wall, 2),
        "run": sum(e["e"] == "step" for e in events),
        "restarts": len(starts),
        "resumed_from": [e["from"] for e in starts],
        "ledger": ledger_line(err),
    }
    if final and code == 0:
        result["final"] = int(final[0]["step"])
        t = truth(events, int(final[0]["step"]))
        result["kept_s"], result["rerun_s"] = round(t["kept_s"], 2), round(t["rerun_s"], 2)
        result["goodput"] = t["kept_s"] / wall
    else:
        result["error"] = err[-3:]
    return result


def _median_us(fn: Any, repeat: int = 200) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def ledger_cost(nodes: int = 256, attempts: int = 20, interval: float = 5.0) -> None:
    """The ledger's cost: agent CPU per status write, bytes per document, reader time."""
    s = 1_000_000_000
    now = [0]
    rec = GoodputRecorder(clock=lambda: now[0])
    rec.launched()
    ranks = [RankSteps(10, 1 * s, 500, 60 * s, 2 * s, s) for _ in range(8)]
    for i in range(attempts):  # a long-suffering run: 20 attempts of 8 ranks
        now[0] = i * 100 * s
        with rec.wait():
            now[0] += s
        rec.attempt_started()
        now[0] += 90 * s
        rec.attempt_ended(ranks, "crash" if i % 2 else "hang", now[0] - s)
    rec.attempt_started()
    rec.steps = lambda: ranks
    now[0] += 50 * s
    per_write = _median_us(lambda: rec.ledger().record())  # type: ignore[union-attr]
    record = rec.ledger().record()  # type: ignore[union-attr]
    size = len(json.dumps({"goodput": record}, separators=(",", ":")))
    docs = [{"v": 1, "node": f"n{i}", "goodput": record, "time": 0.0} for i in range(nodes)]
    bare = [{k: v for k, v in d.items() if k != "goodput"} for d in docs]
    reader = _median_us(lambda: combine([d["goodput"] for d in docs]), 50)
    view_with = _median_us(lambda: summarize("r", docs, 1.0), 20)
    view_without = _median_us(lambda: summarize("r", bare, 1.0), 20)
    print(f"\nledger cost ({attempts + 1} attempts of 8 ranks, {len(BADPUT)} badput categories):")
    print(
        f"  agent CPU per status write (ledger + record): {per_write:.0f} us, every {interval:g} s"
    )
    print(f"  bytes added to each status document: {size}; store requests added: 0")
    print(f"  at {nodes} nodes: +{nodes * size / interval / 1024:.1f} KiB/s into the store")
    print(
        f"  reader: combine {nodes} ledgers {reader / 1000:.2f} ms;"
        f" summarize {view_with / 1000:.2f} ms with vs {view_without / 1000:.2f} ms without"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="wall seconds per run")
    parser.add_argument("--fault-every", type=float, default=30.0)
    parser.add_argument("--compute-seconds", type=float, default=0.08)
    parser.add_argument("--disk-every", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=list(LAUNCHERS), choices=LAUNCHERS)
    parser.add_argument("--ledger-cost-only", action="store_true")
    opts = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    if not opts.ledger_cost_only:
        results = {}
        for name in opts.only:
            results[name] = run_once(name, opts)
            print(f"{name}: {results[name]}", flush=True)
        print(f"load average at the end: {os.getloadavg()}")
        report(results)
    ledger_cost()


def report(results: dict[str, dict[str, object]]) -> None:
    head = f"{'final':>6} {'lost':>5} {'faults':>6} {'goodput':>8} {'vs ceil':>7} {'vs torch':>8}"
    print(f"\n{'launcher':16} {head}   ledger: ratio, productive / kept s, rollback / re-run s")
    base = results.get("torchrun-disk", {}).get("goodput")
    ceiling = results.get("ceiling", {}).get("goodput")
    for name, r in results.items():
        if "final" not in r:
            print(f"{name:16} failed: {r}")
            continue
        final, run, g = int(r["final"]), int(r["run"]), float(r["goodput"])  # type: ignore[call-overload, arg-type]
        ceil = f"{g / float(ceiling):7.2f}" if ceiling else f"{'-':>7}"  # type: ignore[arg-type]
        torch = f"{g / float(base):8.2f}" if base else f"{'-':>8}"  # type: ignore[arg-type]
        ledger = r.get("ledger")
        seen = (
            f"   {ledger['ratio']:.1%}, {ledger['ratio'] * ledger['wall']:.1f}"
            f" / {r['kept_s']} s, {ledger.get('rollback', 0.0):.1f} / {r['rerun_s']} s"
            if isinstance(ledger, dict)
            else "   -"
        )
        print(
            f"{name:16} {final:6} {run - final:5} {r['restarts']:>6} {g:8.1%} {ceil} {torch}{seen}"
        )


if __name__ == "__main__":
    main()
