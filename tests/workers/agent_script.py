"""An agent-like process for tests that need the agent in its own process.

Usage: ``python agent_script.py MODE JSON``.

- ``hold``: start one worker (``argv`` in JSON), print ``started <pid>``, wait forever.
  ``"backend": "asyncio" | "uvloop" | "trio"`` in JSON picks the event loop (any mode).
- ``logs``: start ``n`` workers with LogDestinations from JSON; each prints
  ``out <rank> <i>`` lines to stdout and ``err <rank>`` to stderr; wait for all.
- ``callable``: run :func:`square_sum` (defined here, in ``__main__``) as a
  callable worker and print its JSON result.
"""

from __future__ import annotations

import json
import os
import sys

import anyio

from aelastic.workers import ProcessSpec, open_worker_processes
from aelastic.workers._callable import callable_process_args, read_callable_result
from aelastic.workers._logs import LogDestinations

WORKER = (
    "import sys\n"
    "r = int(sys.argv[1])\n"
    "for i in range(3): print(f'out {r} {i}')\n"
    "print('partial', end='')\n"
    "print(f'err {r}', file=sys.stderr)\n"
)


def square_sum(values: list[int], scale: float) -> dict[str, float]:
    return {"sum": sum(v * v for v in values) * scale}


async def hold(cfg: dict[str, object]) -> None:
    argv = [str(a) for a in cfg["argv"]]  # type: ignore[attr-defined]
    async with open_worker_processes([ProcessSpec(0, argv, dict(os.environ))]) as w:
        print(f"started {w.pids[0]}", flush=True)
        await anyio.sleep_forever()


async def logs(cfg: dict[str, object]) -> None:
    n = int(cfg["n"])  # type: ignore[call-overload]
    dest = LogDestinations.for_attempt(
        cfg.get("log_dir"),  # type: ignore[arg-type]
        "job1",
        0,
        n,
        redirects=cfg.get("redirects", 0),  # type: ignore[arg-type]
        tee=cfg.get("tee", 0),  # type: ignore[arg-type]
        local_ranks_filter=set(cfg["filter"]) if cfg.get("filter") is not None else None,  # type: ignore[call-overload]
        prefix_template=cfg.get("template"),  # type: ignore[arg-type]
        global_ranks={r: 10 + r for r in range(n)},
    )
    specs = [
        dest.process_spec(r, [sys.executable, "-c", WORKER, str(r)], os.environ) for r in range(n)
    ]
    async with open_worker_processes(specs) as w:
        await w.wait_all()
    print(f"attempt_dir {dest.attempt_dir}", flush=True)


async def run_callable(cfg: dict[str, object]) -> None:
    result_file = str(cfg["result_file"])
    argv = callable_process_args(square_sum, ([1, 2, 3], 0.5), result_file=result_file)
    async with open_worker_processes([ProcessSpec(0, argv, dict(os.environ))]) as w:
        exit_ = await w.wait_for_exit()
    print(json.dumps({"exitcode": exit_.exitcode, "result": read_callable_result(result_file)}))


def main() -> None:
    mode, cfg = sys.argv[1], json.loads(sys.argv[2])
    runner = {"hold": hold, "logs": logs, "callable": run_callable}[mode]
    backend = str(cfg.get("backend", "asyncio"))
    if backend == "trio":
        anyio.run(runner, cfg, backend="trio")
    else:
        anyio.run(runner, cfg, backend_options={"use_uvloop": backend == "uvloop"})


if __name__ == "__main__":
    main()
