"""Run a LocalElasticAgent in this process (for the signal tests): probe workers, one node.

Forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to ``agent.send_signal`` the
way the CLI does, prints ``agent-ready <pid>`` once set up, and exits 128+signal when
run() raises SignalException.
"""

import argparse
import signal
import sys
from pathlib import Path

import anyio

from aelastic.agent import LocalElasticAgent, SignalException, WorkerSpec
from aelastic.rendezvous import RendezvousHandler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _shared import LocalRendezvous, lapse_handler

SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", required=True)
    parser.add_argument("--mode", default="hold")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--shutdown-timeout", type=float, default=5.0)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--c10d", default=None, help="endpoint of a c10d store (1..2 nodes)")
    args = parser.parse_args()
    handler: RendezvousHandler = LocalRendezvous("signal-test")
    if args.c10d:
        handler = lapse_handler(args.c10d)
    spec = WorkerSpec(
        role="default",
        local_world_size=args.nproc,
        rdzv_handler=handler,
        entrypoint=sys.executable,
        args=(
            "-u",
            sys.argv[0].replace("run_agent.py", "probe_worker.py"),
            "--report",
            args.report,
            "--mode",
            args.mode,
        ),
        max_restarts=0,
        shutdown_timeout=args.shutdown_timeout,
        log_dir=args.log_dir,
    )
    agent = LocalElasticAgent(spec)
    async with handler, anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(*SIGNALS) as signals:

            async def forward() -> None:
                async for sig in signals:
                    agent.send_signal(sig)

            tg.start_soon(forward)
            print(f"agent-ready {__import__('os').getpid()}", flush=True)
            try:
                result = await agent.run()
            except SignalException as exc:
                print(f"agent-signal {exc.sigval.name}", flush=True)
                tg.cancel_scope.cancel()
                return 128 + int(exc.sigval)
            tg.cancel_scope.cancel()
    print(f"agent-result {result.state.value}", flush=True)
    return 1 if result.is_failed() else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
