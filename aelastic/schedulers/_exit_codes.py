"""The exit-code contract: what each exit status of ``python -m aelastic run`` means to a
scheduler, and whether the scheduler should run the node again.

Plain data (:data:`EXIT_CODES`) and plain functions that render it: the table in
``docs/kubernetes.md`` (which ``docs/slurm.md`` points to) and the ``podFailurePolicy``
rules shown there are produced from this data and checked against it by the tests,
so the documentation and the code cannot drift apart. Nothing here does I/O.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from ..agent._policy import NO_PROGRESS_EXIT_CODE, PREEMPTED_EXIT_CODE
from ..nodes import NODE_UNHEALTHY_EXIT_CODE
from ..nodes._exceptions import NODE_EXCLUDED_EXIT_CODE

__all__ = (
    "EXIT_CODES",
    "ExitCode",
    "codes_with_action",
    "exit_code_table",
    "pod_failure_rules",
)

#: What a Kubernetes Job's ``podFailurePolicy`` does with a pod that exited so:
#: ``FailJob`` (stop the whole Job), ``Ignore`` (run the pod again without counting it
#: against ``backoffLimit``), ``Count`` (run it again, counted), ``none`` (success).
Action = Literal["FailJob", "Ignore", "Count", "none"]
#: ``yes``: run it again; ``limited``: again, but only a bounded number of times (the
#: cause may be lasting); ``no``: running it again cannot help.
Retry = Literal["yes", "limited", "no"]


@dataclass(frozen=True)
class ExitCode:
    """One exit status: its meaning, whether to retry, and what each scheduler should do."""

    code: int
    name: str
    meaning: str
    retry: Retry
    slurm: str
    kubernetes: Action


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(
        0,
        "success",
        "every worker of this node succeeded; also a spare node the job did not need",
        "no",
        "done",
        "none",
    ),
    ExitCode(
        1,
        "failed",
        "the workers failed after --max-restarts restarts, or the launcher could not go on",
        "limited",
        "requeue a bounded number of times (SLURM_RESTART_COUNT)",
        "Count",
    ),
    ExitCode(
        2,
        "usage",
        "a bad flag, value or setting; no worker was started",
        "no",
        "do not requeue: fix the command",
        "FailJob",
    ),
    ExitCode(
        NO_PROGRESS_EXIT_CODE,
        "no-progress",
        "no step progress over --max-no-progress-restarts attempts",
        "no",
        "do not requeue: the job cannot advance",
        "FailJob",
    ),
    ExitCode(
        NODE_UNHEALTHY_EXIT_CODE,
        "node-unhealthy",
        "this node failed a health check and the job ended without it",
        "no",
        "do not requeue on this node: drain it",
        "FailJob",
    ),
    ExitCode(
        NODE_EXCLUDED_EXIT_CODE,
        "node-excluded",
        "this node was excluded after --exclude-node-after failed rounds",
        "no",
        "do not requeue on this node: drain it",
        "FailJob",
    ),
    ExitCode(
        PREEMPTED_EXIT_CODE,
        "preempted",
        "preempted; the newest complete step was persisted to --checkpoint-dir",
        "yes",
        "requeue: the job resumes at that step",
        "Ignore",
    ),
    ExitCode(
        128 + signal.SIGINT,
        "interrupted",
        "stopped by SIGINT (Ctrl-C): someone stopped it on purpose",
        "no",
        "do not requeue",
        "FailJob",
    ),
    ExitCode(
        128 + signal.SIGKILL,
        "killed",
        "SIGKILL reached the launcher (out of memory, or a grace period ran out)",
        "limited",
        "requeue a bounded number of times",
        "Count",
    ),
    ExitCode(
        128 + signal.SIGTERM,
        "terminated",
        "stopped by SIGTERM: a preemption, an eviction or a cancel; workers stopped too",
        "yes",
        "requeue (Slurm requeues a preempted --requeue job itself)",
        "Ignore",
    ),
)


def codes_with_action(action: Action) -> list[int]:
    """The exit codes whose ``podFailurePolicy`` action is ``action``, ascending."""
    return sorted(e.code for e in EXIT_CODES if e.kubernetes == action)


def exit_code_table() -> str:
    """The contract as a Markdown table (as ``docs/kubernetes.md`` shows it)."""
    lines = [
        "| Code | Name | Meaning | Retry | Slurm | `podFailurePolicy` |",
        "|---:|---|---|---|---|---|",
    ]
    for e in sorted(EXIT_CODES, key=lambda e: e.code):
        action = "(succeeded)" if e.kubernetes == "none" else f"`{e.kubernetes}`"
        lines.append(f"| {e.code} | {e.name} | {e.meaning} | {e.retry} | {e.slurm} | {action} |")
    return "\n".join(lines) + "\n"


def pod_failure_rules(container: str = "trainer", indent: int = 0) -> str:
    """The ``podFailurePolicy`` block of a Job (or a JobSet's job template) for the
    contract, as YAML text: a disruption (preemption, eviction, node drain) and the
    ``Ignore`` codes run the pod again for free, the ``FailJob`` codes end the Job, and
    every other failure counts against ``backoffLimit`` (no rule needed: the default).
    Kubernetes accepts a ``podFailurePolicy`` only with ``restartPolicy: Never``."""
    pad = " " * indent

    def values(action: Action) -> str:
        return "[" + ", ".join(str(c) for c in codes_with_action(action)) + "]"

    text = f"""\
podFailurePolicy:
  rules:
  - action: Ignore          # preemption, eviction, node drain: not the job's fault
    onPodConditions:
    - type: DisruptionTarget
  - action: Ignore          # preempted with the newest step saved, or SIGTERM
    onExitCodes:
      containerName: {container}
      operator: In
      values: {values("Ignore")}
  - action: FailJob         # usage, no progress, bad node, interrupted: retrying cannot help
    onExitCodes:
      containerName: {container}
      operator: In
      values: {values("FailJob")}
"""
    return "".join(pad + line if line else line for line in text.splitlines(keepends=True))
