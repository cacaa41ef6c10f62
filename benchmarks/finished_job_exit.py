"""Issue 31 item 9: does the launcher of a finished job exit? Loops the example DDP job.

    python benchmarks/finished_job_exit.py RUNS [LAUNCHER FLAGS ...]
    python benchmarks/finished_job_exit.py 30 --preload auto --exit-grace 5

Each run: ``python -m aelastic run --standalone --nproc-per-node 2 --max-restarts 1
<flags> examples/train_ddp.py --steps 300 --checkpoint-every 100 --crash-at-step 205``.
A run whose launcher is still there 60 s after ``FINAL`` is printed counts as stuck: the
launcher's children (the workers) are listed with their threads' kernel waits and dumped
with ``py-spy dump --native`` (when installed), then everything is killed. Prints one line
per run (exit code, stuck or not, whether the launcher reported killing a worker).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUCK_AFTER = 60.0


def _children(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return found.stdout.split()


def _dump(pid: str) -> None:
    tasks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f, open(f"/proc/{pid}/task/{tid}/wchan") as w:
            tasks[tid] = f"{f.read().strip()} {w.read()}"
    print(f"--- pid {pid}: {tasks}", flush=True)
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if py_spy:
        dump = subprocess.run([py_spy, "dump", "--native", "--pid", pid], capture_output=True)
        print(dump.stdout.decode(errors="replace")[-6000:], flush=True)


def run_once(extra: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="finished_job_exit_") as d:
        cmd = [sys.executable, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "2"]
        cmd += ["--max-restarts", "1", *extra, "examples/train_ddp.py", "--steps", "300"]
        cmd += ["--checkpoint", os.path.join(d, "c"), "--checkpoint-every", "100"]
        cmd += ["--crash-at-step", "205"]
        log = os.path.join(d, "out")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        start, final_at, stuck = time.monotonic(), None, False
        while proc.poll() is None and time.monotonic() - start < 600:
            time.sleep(0.5)
            with open(log, "rb") as f:
                text = f.read()
            if final_at is None and b"FINAL" in text:
                final_at = time.monotonic()
            if final_at is not None and time.monotonic() - final_at > STUCK_AFTER:
                stuck = True
                for child in _children(proc.pid):
                    _dump(child)
                break
        if proc.poll() is None:
            for child in _children(proc.pid):
                os.killpg(int(child), signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        with open(log, "rb") as f:
            text = f.read()
        killed = b"Killed with SIGKILL" in text
        if stuck:  # what the launcher said about it
            print(text.decode(errors="replace")[-3000:], flush=True)
    return f"rc={proc.returncode} final={final_at is not None} stuck={stuck} killed={killed}"


def main() -> None:
    runs, extra = int(sys.argv[1]), sys.argv[2:]
    for i in range(runs):
        print(f"run {i} {extra}: {run_once(extra)}", flush=True)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
