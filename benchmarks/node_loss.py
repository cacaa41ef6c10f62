"""Node loss: how fast the survivors act when an agent is SIGKILLed, aelastic vs torchrun.

    python benchmarks/node_loss.py [--trials 3] [--seed 1] [--only aelastic|torchrun]

Runs the chaos suite's trials (``tests/chaos/_harness.py``: three launchers,
``--nnodes 2:3``, c10d on 127.0.0.1, one gloo worker each) for the faults "SIGKILL an
agent during the rendezvous / start-up / training" and "SIGKILL the agent hosting the
c10d store during training", with torch's default heartbeat (``keep_alive_interval=5``
x ``keep_alive_max_attempt=3`` = 15 s) for both launchers instead of the suite's 2 s:
what a launcher notices faster than that, it notices without a heartbeat. Trials
alternate between the launchers. Prints, per fault and launcher, the outcomes and the
median and worst times from the SIGKILL until the survivors' old workers were gone
(``reacted``) and until rank 0 of the new world ran (``recovered``).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos._harness import TORCHRUN, Fault
from chaos._table import run_table
from launcher._nodes import AELASTIC_RUN

LAUNCHERS = {"aelastic": AELASTIC_RUN, "torchrun": TORCHRUN}
FAULTS = (
    Fault("agent", signal.SIGKILL, "rendezvous"),
    Fault("agent", signal.SIGKILL, "startup"),
    Fault("agent", signal.SIGKILL, "training"),
    Fault("host", signal.SIGKILL, "training"),
)
#: torch's default heartbeat, for both launchers (the suite's CONF uses 1 s x 2).
TORCH_DEFAULT_CONF = (
    "keep_alive_interval=5,keep_alive_max_attempt=3,join_timeout=60,close_timeout=5"
)


async def _main(opts: argparse.Namespace) -> None:
    launchers = {n: c for n, c in LAUNCHERS.items() if opts.only in (None, n)}
    await run_table(FAULTS, launchers, trials=opts.trials, seed=opts.seed, conf=TORCH_DEFAULT_CONF)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=sorted(LAUNCHERS))
    anyio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
