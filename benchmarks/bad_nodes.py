"""Bad nodes under torchrun and aelastic, side by side: a crash-looping node, a frozen node.

    python benchmarks/bad_nodes.py [--trials 1] [--only aelastic|torchrun] [--bound 60]
                                   [--faults crash,member,host]

Three launchers (``--nnodes 2:3 --nproc-per-node 1``, c10d on 127.0.0.1, node 0 hosts the
store), workers ``tests/launcher/node_worker.py`` (no torch: membership is the point).

* **crash loop**: node 2's workers always exit 1; ``--max-restarts 3``; aelastic adds
  ``--exclude-node-after 2``. The good workers finish once the world is 2. Reported:
  the launchers' exit codes, the bad node's failed rounds, seconds to the end.
* **frozen member**: once the three workers run (world 3, waiting to be stopped), node 2's
  agent and worker get SIGSTOP; torch's default heartbeat (5 s x 3 = 15 s) for both,
  ``last_call_timeout=1``. Reported: seconds from the SIGSTOP to the first READY line
  of the survivors' new world of 2 (``--bound`` s at most).
* **frozen store host**: the same with node 0, which hosts the c10d store (the others
  run at 127.0.0.2 and 127.0.0.3, so the heir can re-host the store on the same port).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from launcher._nodes import AELASTIC_RUN, WORKER, cluster, free_port, process_tree, records

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LAUNCHERS = {"aelastic": AELASTIC_RUN, "torchrun": TORCHRUN}
CONF = "keep_alive_interval=5,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"


def _argv(port: int, run_id: str, host: bool, addr: str = "127.0.0.1") -> list[str]:
    return [
        "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", f"{CONF},is_host={int(host)}", "--local-addr", addr,
    ]  # fmt: skip


async def crash_loop(name: str, bound: float) -> str:
    launcher = LAUNCHERS[name]
    port = free_port()
    extra = ["--max-restarts", "3"]
    if name == "aelastic":
        extra += ["--exclude-node-after", "2", "--exclude-node-cooldown", "600"]
    with tempfile.TemporaryDirectory() as tmp:
        good, bad = Path(tmp, "good"), Path(tmp, "bad")
        os.makedirs(good)
        os.makedirs(bad)
        started = time.monotonic()
        async with cluster() as c:
            nodes = []
            for i, (out, tail) in enumerate(
                [(good, ["--finish-at-world", "2"])] * 2 + [(bad, ["--exit-code", "1"])]
            ):
                argv = [*_argv(port, "crash", i == 0), *extra, WORKER, str(out), *tail]
                env = {"AELASTIC_NODE_ID": f"node{i}"}
                nodes.append(await c.start(argv, env=env, launcher=launcher))
            codes: list[int | None] = [None] * 3
            with anyio.move_on_after(bound):
                for i, n in enumerate(nodes):
                    codes[i] = await n.wait()
            took = time.monotonic() - started
        failed = len(records(bad))
        finished = sum(1 for r in records(good) if r["WORLD_SIZE"] == "2")
    return (
        f"crash loop  {name:8}: exit codes {codes}, bad node's failed rounds {failed}, "
        f"good workers finished at world 2: {finished}, {took:.1f} s"
    )


async def frozen_node(name: str, bound: float, victim: int) -> str:
    """SIGSTOP node ``victim`` (0: the store's host, 2: a member); see the docstring."""
    launcher = LAUNCHERS[name]
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        tail = [WORKER, tmp, "--finish-at-world", "2"]
        async with cluster() as c:
            nodes = [
                await c.start(
                    [*_argv(port, "frozen", i == 0, f"127.0.0.{i + 1}"), *tail], launcher=launcher
                )
                for i in range(3)
            ]

            def ready(world: int) -> object:
                return lambda line: line.startswith("READY") and line.endswith(f"world={world}")

            with anyio.fail_after(120):
                for n in nodes:
                    await n.wait_for_line(ready(3))
            frozen = process_tree(nodes[victim].process.pid)
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            took: float | None = None
            with anyio.move_on_after(bound):
                await nodes[1].wait_for_line(ready(2))
                took = time.monotonic() - stopped
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
    shown = f"{took:.2f} s" if took is not None else f"no new world within {bound:g} s"
    what = "store host" if victim == 0 else "member"
    return f"frozen {what} {name:8}: SIGSTOP to the survivors' new world: {shown}"


async def _main(opts: argparse.Namespace) -> None:
    print(f"load average {os.getloadavg()}", flush=True)
    names = [n for n in LAUNCHERS if opts.only in (None, n)]
    faults = opts.faults.split(",")
    for _ in range(opts.trials):
        if "crash" in faults:
            for name in names:
                print(await crash_loop(name, opts.bound), flush=True)
        for fault, victim in (("member", 2), ("host", 0)):
            if fault in faults:
                for name in names:
                    print(await frozen_node(name, opts.bound, victim), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--only", choices=sorted(LAUNCHERS))
    parser.add_argument("--bound", type=float, default=60.0)
    parser.add_argument("--faults", default="crash,member,host", help="comma-separated")
    anyio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
