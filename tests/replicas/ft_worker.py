"""A torchft data-parallel worker for the replica-group tests and benchmark.

Each step: start the quorum, one forward/backward on a fixed batch, an allreduce of
the gradients through the torchft Manager, commit. Appends one JSON line per step to
``$FT_LOG_DIR/steps-rg<REPLICA_GROUP_ID>.jsonl`` (wall time, when its quorum
returned, step, participants, restart count) and, at the end, the parameters to
``params-rg<ID>.json``. Other records: ``start`` (an attempt's interpreter runs
main), ``quorum`` (its first quorum returned: the group is back in), ``crash``.

``FT_CRASH`` = ``"<group>:<step>"`` makes that group's first attempt exit 1 at the
first step from that one on in which every group takes part (on a loaded machine a
group may start seconds after the others, and join healed), or 20 steps later in any
case (a loaded machine can leave one group out of every quorum; seen in CI: 400 steps
of quorums of two of three groups); ``<group>:always``
crashes every attempt before its Manager starts. ``FT_RESTART_DELAY``: seconds of
start-up for a restarted attempt. ``FT_STEPS`` steps in all, ``FT_STEP_SLEEP``
seconds of "compute" per step, ``FT_TIMEOUT`` and ``FT_QUORUM_TIMEOUT``: the Manager's
timeouts for its operations and for a quorum (10 and 30 seconds).

``FT_END_AFTER_REJOIN`` = ``n`` ends the job early, the same step for every group: the
restarted attempt, at its first step in a quorum of every group, writes ``end`` = that
step + n; every worker reads it after each step. The other groups cannot be more than a
step ahead of a group in their quorum, so each reads it before that step.
``FT_STOP_FILE``: every group leaves its loop after the step in which it finds that
file (a test's signal that it has seen what it waited for). ``FT_MIN_REPLICAS``: the
Manager's ``min_replica_size`` (1): 2 makes the groups step only together, so two groups
started seconds apart on a loaded machine still train together. ``FT_HOSTNAME``: the name
the Manager gives the Lighthouse for itself (the machine's name by default).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import timedelta


def _transport(host: str, timeout: timedelta) -> object:
    """torchft's HTTP checkpoint transport (what the Manager makes by default), whose
    address names ``host`` instead of the machine's name."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class Named(HTTPTransport):  # type: ignore[misc]
        def address(self) -> str:
            own = f"http://{socket.gethostname()}:"
            return str(super().address()).replace(own, f"http://{host}:", 1)

    return Named(timeout=timeout, num_chunks=0)


def main() -> None:
    group = int(os.environ["REPLICA_GROUP_ID"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_dir = os.environ["FT_LOG_DIR"]
    steps = int(os.environ.get("FT_STEPS", "40"))
    pause = float(os.environ.get("FT_STEP_SLEEP", "0.05"))
    crash_group, _, crash_at = os.environ.get("FT_CRASH", ":").partition(":")
    crashes = crash_group == str(group) and (crash_at == "always" or attempt == 0)
    if crashes and crash_at == "always":
        sys.exit(3)
    import torch  # after the crash above: a crash-looping group restarts fast
    from torchft import Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    path = os.path.join(log_dir, f"steps-rg{group}.jsonl")
    with open(path, "a", buffering=1) as out:
        out.write(json.dumps({"t": time.time(), "start": True, "attempt": attempt}) + "\n")
        if attempt > 0:
            time.sleep(float(os.environ.get("FT_RESTART_DELAY", "0")))

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        inner = torch.optim.SGD(model.parameters(), lr=0.1)

        def load_state(state: dict[str, object]) -> None:
            model.load_state_dict(state["model"])  # type: ignore[arg-type]
            inner.load_state_dict(state["optim"])  # type: ignore[arg-type]

        host = os.environ.get("FT_HOSTNAME") or socket.gethostname()
        timeout = float(os.environ.get("FT_TIMEOUT", "10"))
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
            load_state_dict=load_state,
            state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
            min_replica_size=int(os.environ.get("FT_MIN_REPLICAS", "1")),
            replica_id=f"rg{group}",
            use_async_quorum=False,
            timeout=timedelta(seconds=timeout),
            quorum_timeout=timedelta(seconds=float(os.environ.get("FT_QUORUM_TIMEOUT", "30"))),
            connect_timeout=timedelta(seconds=10),
            # the name other groups reach this group's Manager and checkpoint server by
            # (FT_HOSTNAME: a test host's address; the machine's name is its loopback)
            hostname=host,
            checkpoint_transport=_transport(host, timedelta(seconds=timeout)),
        )
        optimizer = OptimizerWrapper(manager, inner)
        everyone_n = int(os.environ["NUM_REPLICA_GROUPS"])
        x = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8
        joined = False
        end_file = os.path.join(log_dir, "end")
        end_after = int(os.environ.get("FT_END_AFTER_REJOIN", "0"))
        stop_file = os.environ.get("FT_STOP_FILE")
        while manager.current_step() < steps:
            optimizer.zero_grad()
            quorum_at = time.time()
            if not joined:
                joined = True
                record = {"quorum": True, "attempt": attempt, "step": manager.current_step()}
                out.write(json.dumps({"t": time.time(), **record}) + "\n")
            loss = model(x + group).square().sum()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                manager.allreduce(p.grad).wait()
            time.sleep(pause)
            everyone = manager.num_participants() == everyone_n
            step = manager.current_step()
            if crashes and step >= int(crash_at) + (0 if everyone else 20):
                out.write(json.dumps({"t": time.time(), "crash": True, "group": group}) + "\n")
                os._exit(1)
            optimizer.step()
            record = {"group": group, "attempt": attempt, "step": manager.current_step()}
            record["q"] = quorum_at
            record["participants"] = manager.num_participants()
            out.write(json.dumps({"t": time.time(), **record}) + "\n")
            print(f"FT_STEP {group} {manager.current_step()} {attempt}", flush=True)
            rejoined = attempt > 0 and record["participants"] == everyone_n
            if end_after and rejoined and not os.path.exists(end_file):
                with open(end_file + ".tmp", "w") as f:
                    f.write(str(manager.current_step() + end_after))
                os.replace(end_file + ".tmp", end_file)
            if stop_file and os.path.exists(stop_file):
                break
            if os.path.exists(end_file):
                with open(end_file) as f:
                    steps = min(steps, int(f.read()))
        params = [p.detach().flatten().tolist() for p in model.parameters()]
        with open(os.path.join(log_dir, f"params-rg{group}.json"), "w") as f:
            json.dump(params, f)
        manager.shutdown(wait=False)
    # torchft's threads and servers take seconds to wind down at the interpreter's exit;
    # everything is written: leave now
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
