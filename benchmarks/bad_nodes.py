"""Bad nodes under torchrun and aelastic, side by side: a crash-looping node, a frozen node.

    python benchmarks/bad_nodes.py [--trials 1] [--only aelastic|torchrun] [--bound 60]
                                   [--faults crash,member,host,barrier-host,...]

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
* **frozen store host at the exit barrier** (``barrier-host``): node 0's worker exits 0
  at once and its agent waits at the exit barrier; it gets SIGSTOP, then the others'
  workers exit 0 and they arrive at the barrier. **Frozen member at the exit barrier**
  (``barrier-member``): nodes 0 and 1 wait at the barrier, node 2's worker still runs
  when node 2 gets SIGSTOP. Default exit barrier timeout (300 s) for both launchers.
  Reported: seconds from the SIGSTOP until both other launchers exited, and their codes.
* **frozen while joining** (``rdzv-first``, ``rdzv-second``): ``--nnodes 3``, a standalone
  store (``python -m aelastic store``; every launcher a client), node 0 joins, then node
  1; the first (aelastic: the round's coordinator) or the second joiner gets SIGSTOP
  before the round completes; then nodes 2 and 3 start. Reported: seconds from the
  SIGSTOP until the three others run a world of 3.
"""

from __future__ import annotations

import argparse
import base64
import os
import pickle
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from launcher._nodes import (
    AELASTIC_RUN,
    WORKER,
    Node,
    cluster,
    free_port,
    process_tree,
    records,
)

from aelastic.store import TCPStoreClient

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LAUNCHERS = {"aelastic": AELASTIC_RUN, "torchrun": TORCHRUN}
CONF = "keep_alive_interval=5,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"


def _argv(
    port: int, run_id: str, host: bool, addr: str = "127.0.0.1", nnodes: str = "2:3"
) -> list[str]:
    return [
        "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", f"{CONF},is_host={int(host)}", "--local-addr", addr,
    ]  # fmt: skip


def ready(world: int) -> Callable[[str], bool]:
    return lambda line: line.startswith("READY") and line.endswith(f"world={world}")


def _freeze(pid: int) -> list[int]:
    """SIGSTOP ``pid`` and its descendants (a whole node); return them for SIGCONT."""
    frozen = process_tree(pid)
    for p in frozen:
        os.kill(p, signal.SIGSTOP)
    return frozen


def _thaw(frozen: list[int]) -> None:
    for p in frozen:
        os.kill(p, signal.SIGCONT)


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

            with anyio.fail_after(120):
                for n in nodes:
                    await n.wait_for_line(ready(3))
            frozen = _freeze(nodes[victim].process.pid)
            stopped = time.monotonic()
            took: float | None = None
            with anyio.move_on_after(bound):
                await nodes[1].wait_for_line(ready(2))
                took = time.monotonic() - stopped
            _thaw(frozen)
    shown = f"{took:.2f} s" if took is not None else f"no new world within {bound:g} s"
    what = "store host" if victim == 0 else "member"
    return f"frozen {what} {name:8}: SIGSTOP to the survivors' new world: {shown}"


async def frozen_at_barrier(name: str, bound: float, victim: int) -> str:
    """SIGSTOP node ``victim`` (0: the store's host, waiting at the exit barrier; 2: a
    member whose worker still runs while the others wait there); see the docstring."""
    launcher = LAUNCHERS[name]
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp, "finish")
        late = [WORKER, tmp, "--when-file", str(marker if victim == 0 else "/nonexistent")]
        tails = [[WORKER, tmp], late, late] if victim == 0 else [[WORKER, tmp]] * 2 + [late]
        async with cluster() as c:
            nodes = [
                await c.start(
                    [*_argv(port, "barrier", i == 0, f"127.0.0.{i + 1}", "3"), *tails[i]],
                    env={"LOGLEVEL": "INFO"},
                    launcher=launcher,
                )
                for i in range(3)
            ]
            others = [n for i, n in enumerate(nodes) if i != victim]
            with anyio.fail_after(120):
                for n in [nodes[0]] if victim == 0 else others:
                    await n.wait_for_err("for other agents")  # both launchers' barrier line
            frozen = _freeze(nodes[victim].process.pid)
            stopped = time.monotonic()
            await anyio.Path(marker).touch()
            codes: list[int | None] = [None, None]
            with anyio.move_on_after(bound):
                for i, n in enumerate(others):
                    codes[i] = await n.wait()
            took = time.monotonic() - stopped
            _thaw(frozen)
    shown = f"{took:.2f} s" if None not in codes else f"not all within {bound:g} s"
    what = "store host" if victim == 0 else "member"
    return (
        f"frozen {what} at the exit barrier {name:8}: SIGSTOP to the others' exit: {shown}, "
        f"exit codes {codes}"
    )


async def _torch_participants(client: TCPStoreClient, run_id: str, count: int) -> None:
    """Return once torch's rendezvous state (a base64 pickle under one key, see torch's
    ``c10d_rendezvous_backend``) lists ``count`` participants. Polls: torch has no event."""
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401 (unpickling)

    key = f"torch.rendezvous.{run_id}"
    while True:
        if await client.check([key]):
            try:
                state = pickle.loads(base64.b64decode(await client.get(key)))
            except Exception:  # torch's initial sentinel, not a state yet
                state = None
            if state is not None and len(state.participants) >= count:
                return
        await anyio.sleep(0.05)


async def frozen_joining(name: str, bound: float, victim: int) -> str:
    """SIGSTOP the first (0) or second (1) node to join, before the round completes."""
    launcher = LAUNCHERS[name]
    port = free_port()
    store = await anyio.open_process(
        [sys.executable, "-m", "aelastic", "store", "--host", "127.0.0.1", "--port", str(port)]
    )
    try:
        async with TCPStoreClient("127.0.0.1", port, timeout=120, connect_timeout=60) as client:
            with tempfile.TemporaryDirectory() as tmp:
                tail = [WORKER, tmp, "--finish-at-world", "3"]
                async with cluster() as c:

                    async def start(i: int) -> Node:
                        argv = _argv(port, "joining", False, f"127.0.0.{i + 1}", "3")
                        return await c.start([*argv, *tail], launcher=launcher)

                    async def joined(count: int) -> None:
                        if name == "torchrun":
                            await _torch_participants(client, "joining", count)
                        else:  # the coordinator's first tick, then ticket 1's registration
                            key = "tick" if count == 1 else "node/1"
                            await client.wait([f"rdzv/joining/c/0/{key}"])

                    with anyio.fail_after(120):
                        first = await start(0)
                        await joined(1)
                        second = await start(1)
                        await joined(2)
                    frozen = _freeze((first, second)[victim].process.pid)
                    stopped = time.monotonic()
                    others = [(second, first)[victim], await start(2), await start(3)]
                    took: float | None = None
                    with anyio.move_on_after(bound):
                        for n in others:
                            await n.wait_for_line(ready(3))
                        took = time.monotonic() - stopped
                    _thaw(frozen)
    finally:
        store.kill()
        await store.wait()
    shown = f"{took:.2f} s" if took is not None else f"no world of 3 within {bound:g} s"
    what = "first" if victim == 0 else "second"
    return f"frozen {what} joiner {name:8}: SIGSTOP to the others' world of 3: {shown}"


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
        for fault, victim in (("barrier-host", 0), ("barrier-member", 2)):
            if fault in faults:
                for name in names:
                    print(await frozen_at_barrier(name, opts.bound, victim), flush=True)
        for fault, victim in (("rdzv-first", 0), ("rdzv-second", 1)):
            if fault in faults:
                for name in names:
                    print(await frozen_joining(name, opts.bound, victim), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--only", choices=sorted(LAUNCHERS))
    parser.add_argument("--bound", type=float, default=60.0)
    parser.add_argument("--faults", default="crash,member,host", help="comma-separated")
    anyio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
