"""Two jobs in one async service: one runs to its end, the other is cancelled.

    python examples/embed_service.py

The service starts a long job with ``task_group.start(aelastic.run_job, ...)`` (it
returns once the workers are up), runs a short job with ``aelastic.open_job`` while
printing its state transitions as the agent makes them, then cancels the long job:
its workers are stopped and its node leaves the rendezvous. Both jobs serve
``/healthz /readyz /status /metrics`` on a free loopback port. No torch needed: this
file is also the worker. ``--backend`` picks the anyio backend (trio needs every part
of aelastic on trio: issue 11 item 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request

import anyio
import anyio.to_thread

import aelastic
from aelastic import HealthSettings


def worker(seconds: float) -> int:
    """The workers: report, then run ``seconds`` (the long job's run until stopped)."""
    print(f"worker rank={os.environ['RANK']} pid={os.getpid()}", flush=True)
    if seconds > 0:
        import time

        time.sleep(seconds)
    return 0


def config() -> aelastic.LaunchConfig:
    return aelastic.LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        health=HealthSettings(port=0),  # any free port on 127.0.0.1
    )


def fetch_status(address: tuple[str, int]) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/status", timeout=10) as r:
        return dict(json.load(r))


#: this file, run as the jobs' worker
WORKER = (sys.executable, "-u", os.path.abspath(__file__), "--worker")


async def service() -> None:
    me = WORKER
    async with anyio.create_task_group() as tg:
        long = await tg.start(aelastic.run_job, config(), *me, "600")
        assert long.health_address is not None
        status = await anyio.to_thread.run_sync(fetch_status, long.health_address)
        print(f"[long] {status['state']}, worker pids {[w['pid'] for w in status['workers']]}")

        async with aelastic.open_job(config(), *me, "0") as short:
            async for change in short.state_changes():
                print(f"[short] {change.state.value} (round {change.round})")
            print(f"[short] result {await short.wait()}")

        tg.cancel_scope.cancel()  # the service no longer wants the long job
    print(f"[long] cancelled: {long.state.value}, pids {[w.pid for w in long.workers()]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    parser.add_argument("--worker", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return worker(args.worker)
    anyio.run(service, backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
