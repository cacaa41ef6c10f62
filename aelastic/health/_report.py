"""What the health endpoint reports about a job: ``/status`` JSON and ``/metrics`` text.

Plain functions of a job's live values (a :class:`JobView`, such as
:class:`aelastic.Job`): nothing awaits, nothing blocks, so a probe costs the job's
event loop a few microseconds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..agent import WorkerState
from ._view import JobView

__all__ = ("is_ready", "metrics_text", "status")


def is_ready(job: JobView) -> bool:
    """Whether the workers are running (``HEALTHY``): what ``/readyz`` answers."""
    return job.state is WorkerState.HEALTHY


def status(job: JobView) -> dict[str, Any]:
    """The ``/status`` document: node, role, run id, round, state, restarts, workers, failure.

    ``idle_interpreters``: the warm pool's idle interpreters and their resident memory
    (what ``--preload`` costs).
    """
    failure, hang = job.last_failure, job.last_hang
    idle, idle_rss = job.idle_interpreters()
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
        "hangs": job.hang_count,
        "last_hang": None if hang is None else dataclasses.asdict(hang),
        "idle_interpreters": {"count": idle, "rss_bytes": idle_rss},
        "checkpoint": job.checkpoint_status(),
        "node_health": job.node_health(),
        "stragglers": job.straggler_status(),
        "time": time.time(),
    }


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _optional(name: str, help_: str, value: int | None) -> list[tuple[str, str, str, int]]:
    """A gauge that is left out while it has no value (Prometheus: absent, not 0)."""
    return [] if value is None else [(name, "gauge", help_, value)]


def metrics_text(job: JobView) -> str:
    """The ``/metrics`` page: Prometheus text exposition format 0.0.4, written by hand."""
    labels = f'run_id="{_escape(job.run_id)}",role="{_escape(job.role)}"'
    state = job.state
    running = sum(1 for w in job.workers() if w.pid is not None) if is_ready(job) else 0
    lines = [
        "# HELP aelastic_job_state 1 for the worker group's current state, else 0.",
        "# TYPE aelastic_job_state gauge",
        *(
            f'aelastic_job_state{{{labels},state="{s.value}"}} {int(s is state)}'
            for s in WorkerState
        ),
    ]
    for name, kind, help_, value in (
        ("restarts_total", "counter", "Worker-group failures restarted.", job.restart_count),
        ("restarts_left", "gauge", "Failures that may still be restarted.", job.remaining_restarts),
        ("round", "gauge", "Rendezvous round of the current workers.", job.round or 0),
        ("workers_running", "gauge", "Local workers running now.", running),
        ("ready", "gauge", "1 when the workers are running.", int(is_ready(job))),
        ("progress_hangs_total", "counter", "Hung workers found.", job.hang_count),
        (
            "progress_stacks_captured_total",
            "counter",
            "Worker stacks written on hangs.",
            job.stacks_captured,
        ),
        *_optional(
            "progress_heartbeat_age_ms",
            "Milliseconds since the stalest last heartbeat of the running workers.",
            job.heartbeat_age_ms(),
        ),
        *_optional(
            "progress_learned_heartbeat_timeout_ms",
            "Heartbeat timeout learned by learn_timeouts, in milliseconds.",
            None
            if job.learned_heartbeat_timeout is None
            else round(job.learned_heartbeat_timeout * 1000),
        ),
    ):
        lines += [
            f"# HELP aelastic_job_{name} {help_}",
            f"# TYPE aelastic_job_{name} {kind}",
            f"aelastic_job_{name}{{{labels}}} {value}",
        ]
    lines += _straggler_gauges(job, labels)
    return "\n".join(lines + _goodput_lines(job.goodput(), labels)) + "\n"


def _goodput_lines(record: dict[str, Any] | None, labels: str) -> list[str]:
    """This node's goodput ledger (``aelastic.goodput``): ratio, wall, productive and badput.

    Gauges, not counters: the ledger is revised as facts arrive (a crash turns the step
    under way from ``productive`` into ``rollback``), so a category may go down."""
    if record is None:
        return []
    badput = record.get("badput_s") or {}
    return [
        "# HELP aelastic_goodput_ratio Productive time over wall time since the launch.",
        "# TYPE aelastic_goodput_ratio gauge",
        f"aelastic_goodput_ratio{{{labels}}} {record['ratio']}",
        "# HELP aelastic_goodput_wall_seconds Time since the launch: the ledger's total.",
        "# TYPE aelastic_goodput_wall_seconds gauge",
        f"aelastic_goodput_wall_seconds{{{labels}}} {record['wall_s']}",
        "# HELP aelastic_goodput_productive_seconds Time of the steps kept so far"
        " (revised: a crash makes the step under way rollback).",
        "# TYPE aelastic_goodput_productive_seconds gauge",
        f"aelastic_goodput_productive_seconds{{{labels}}} {record['productive_s']}",
        "# HELP aelastic_goodput_badput_seconds Time lost so far, by category"
        " (docs/goodput.md; revised as facts arrive).",
        "# TYPE aelastic_goodput_badput_seconds gauge",
        *(
            f'aelastic_goodput_badput_seconds{{{labels},category="{_escape(c)}"}} {s}'
            for c, s in badput.items()
        ),
    ]


def _straggler_gauges(job: JobView, labels: str) -> list[str]:
    """``aelastic_job_straggler_score`` per local rank (left out while not scored)."""
    stragglers = job.straggler_status()
    scores = {} if stragglers is None else stragglers["scores"]
    if not scores:
        return []
    name = "aelastic_job_straggler_score"
    return [
        f"# HELP {name} Relative speed of the rank: the fastest rank's busy time per step /"
        " its own (1: fastest; below --straggler-threshold for --straggler-min-duration: slow).",
        f"# TYPE {name} gauge",
        *(f'{name}{{{labels},global_rank="{r}"}} {s["relative"]}' for r, s in scores.items()),
    ]
