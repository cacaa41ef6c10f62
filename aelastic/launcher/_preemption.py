"""Preemption: what ``aelastic run`` does on the signal a scheduler sends before it takes
the job away (docs/slurm.md, "Preemption and time limits").

With ``--checkpoint-dir`` SIGUSR1 (Slurm's ``--signal=USR1@N``) is trapped as a
preemption notice: the workers are stopped with SIGTERM, and the agent, on its way out,
persists the newest complete memory step to ``--checkpoint-dir`` (as it does at every
exit). A job stopped so, or by SIGTERM, whose ``--checkpoint-dir`` then holds a whole
step exits :data:`~aelastic.agent._policy.PREEMPTED_EXIT_CODE` (96: retry, the progress
is saved) instead of ``128 + signum``. With ``--requeue`` a SIGUSR1 also requeues the
Slurm job (``scontrol requeue $SLURM_JOB_ID``, run by the job's node 0 only).

Decisions are plain functions; :func:`requeue` is the one async shell (a subprocess,
bounded by :data:`REQUEUE_TIMEOUT`; errors are logged, never raised).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import anyio

__all__ = (
    "NOTICE",
    "REQUEUE_TIMEOUT",
    "persisted_step",
    "requeue",
    "requeue_argv",
    "trapped_signals",
)

log = logging.getLogger(__name__)

#: The preemption notice trapped with ``--checkpoint-dir`` (Slurm's ``--signal=USR1@N``).
NOTICE = signal.SIGUSR1
#: Seconds ``scontrol requeue`` may take before it is given up on (and killed).
REQUEUE_TIMEOUT = 30.0


def trapped_signals(
    handled: Sequence[signal.Signals], checkpoint_dir: str | None
) -> tuple[list[signal.Signals], bool]:
    """The signals to trap, and whether :data:`NOTICE` among them is the preemption notice.

    ``handled`` is ``--signals-to-handle``'s list. A user who lists SIGUSR1 there keeps
    torchrun's meaning (the workers get SIGUSR1 and stop); otherwise, with a
    ``checkpoint_dir``, SIGUSR1 is added as the notice. Without one nothing changes:
    SIGUSR1 keeps its default action, as under torchrun.
    """
    if checkpoint_dir is None or NOTICE in handled:
        return list(handled), False
    return [*handled, NOTICE], True


def persisted_step(checkpoint_dir: str | None) -> int | None:
    """The step whose every rank ``checkpoint_dir`` holds (its manifest's), else None.

    Blocking (one small read): call it in a thread. A missing or unreadable manifest
    is None, never an error.
    """
    if checkpoint_dir is None:
        return None
    try:  # the documented disk format (docs/checkpoints.md): manifest.json names the step
        with open(os.path.join(checkpoint_dir, "manifest.json"), encoding="utf-8") as f:
            step = json.load(f).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def requeue_argv(env: Mapping[str, str]) -> list[str] | None:
    """``scontrol requeue JOBID`` when this process is the Slurm job's node 0, else None.

    Node 0 is ``SLURM_NODEID`` 0 (``SLURM_PROCID`` 0 where the node id is not set; a
    process with neither is the job's only one). None outside Slurm (no
    ``SLURM_JOB_ID``) and on every other node, so the job is requeued once.
    """
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    node = env.get("SLURM_NODEID", env.get("SLURM_PROCID", "0")).strip()
    if node not in ("", "0"):
        return None
    return ["scontrol", "requeue", job]


async def requeue(env: Mapping[str, str]) -> bool:
    """Requeue the Slurm job from its node 0; True when ``scontrol`` said yes.

    Other nodes, and a process outside Slurm, do nothing (False; outside Slurm a
    warning says so). Bounded by :data:`REQUEUE_TIMEOUT` (the subprocess is killed
    past it).
    Errors (no ``scontrol``, a refusal such as a job Slurm already requeues) are
    logged, never raised. Cancellation kills ``scontrol`` and re-raises.
    """
    argv = requeue_argv(env)
    if argv is None:
        if not env.get("SLURM_JOB_ID"):
            log.warning("--requeue: not under Slurm (no SLURM_JOB_ID): nothing to requeue")
        return False
    try:
        with anyio.fail_after(REQUEUE_TIMEOUT):
            done = await anyio.run_process(
                argv, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
    except TimeoutError:
        log.error("--requeue: %s did not answer within %.0f s", " ".join(argv), REQUEUE_TIMEOUT)
        return False
    except OSError as exc:
        log.error("--requeue: could not run %s: %s", argv[0], exc)
        return False
    output = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0:
        log.error("--requeue: %s exited %d: %s", " ".join(argv), done.returncode, output)
        return False
    log.warning("requeued Slurm job %s (%s)", argv[-1], " ".join(argv))
    return True
