"""What the health endpoint reports about a job: ``/status`` JSON and ``/metrics`` text.

Plain functions of a :class:`aelastic.Job`'s live values: nothing awaits, nothing
blocks, so a probe costs the job's event loop a few microseconds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..launcher import Job

__all__ = ("is_ready", "metrics_text", "status")

#: Every state the group can be in (``aelastic.agent.WorkerState`` values).
_STATES = ("INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED", "UNKNOWN")


def is_ready(job: Job) -> bool:
    """Whether the workers are running (``HEALTHY``): what ``/readyz`` answers."""
    return str(job.state.value) == "HEALTHY"


def status(job: Job) -> dict[str, Any]:
    """The ``/status`` document: node, role, run id, round, state, restarts, workers, failure."""
    failure = job.last_failure
    return {
        "node": job.node,
        "role": job.role,
        "run_id": job.run_id,
        "entrypoint": job.name,
        "round": job.round,
        "state": job.state.value,
        "done": job.done,
        "restart_count": job.restart_count,
        "restarts_left": job.remaining_restarts,
        "max_restarts": job.config.max_restarts,
        "workers": [dataclasses.asdict(w) for w in job.workers()],
        "last_failure": None if failure is None else dataclasses.asdict(failure),
        "time": time.time(),
    }


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_text(job: Job) -> str:
    """The ``/metrics`` page: Prometheus text exposition format 0.0.4, written by hand."""
    labels = f'run_id="{_escape(job.run_id)}",role="{_escape(job.role)}"'
    state = job.state.value
    running = sum(1 for w in job.workers() if w.pid is not None) if is_ready(job) else 0
    lines = [
        "# HELP aelastic_job_state 1 for the worker group's current state, else 0.",
        "# TYPE aelastic_job_state gauge",
        *(f'aelastic_job_state{{{labels},state="{s}"}} {1 if s == state else 0}' for s in _STATES),
    ]
    for name, kind, help_, value in (
        ("restarts_total", "counter", "Worker-group failures restarted.", job.restart_count),
        ("restarts_left", "gauge", "Failures that may still be restarted.", job.remaining_restarts),
        ("round", "gauge", "Rendezvous round of the current workers.", job.round or 0),
        ("workers_running", "gauge", "Local workers running now.", running),
        ("ready", "gauge", "1 when the workers are running.", int(is_ready(job))),
    ):
        lines += [
            f"# HELP aelastic_job_{name} {help_}",
            f"# TYPE aelastic_job_{name} {kind}",
            f"aelastic_job_{name}{{{labels}}} {value}",
        ]
    return "\n".join(lines) + "\n"
