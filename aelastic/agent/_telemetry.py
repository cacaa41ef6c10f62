"""What the agent tells the world: its events (torch's ``torchelastic.worker.status.*``
and its own) and torch's SimpleElasticAgent end-of-run metrics.

:class:`AgentTelemetry` is a part of :class:`~aelastic.agent.SimpleElasticAgent` that only
reads the agent's state; recording never raises into the agent (a failing handler is
logged) and never blocks.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import traceback
from collections.abc import Mapping
from typing import Any

from ..events import Event, EventSource, record
from ..metrics import put_metric
from ._policy import flakiness, restart_count
from ._types import RunResult, Worker, WorkerGroup, WorkerState

__all__ = ("AgentTelemetry", "hostname")

log = logging.getLogger("aelastic.agent")


def hostname() -> str:
    """This node's name in events and rendezvous records."""
    # gethostname, not getfqdn: no DNS round trip on the restart path (torchrun's #73656).
    return socket.gethostname()


class AgentTelemetry:
    """The agent's events and metrics, built from the state the agent keeps."""

    _worker_group: WorkerGroup
    _remaining_restarts: int
    _total_execution_time: int

    def _record(self, event: Event) -> None:
        try:
            record(event, self._worker_group.spec.event_log_handler)
        except Exception:
            log.exception("failed to record event %s", event.name)

    def _emit(self, name: str, metadata: Mapping[str, Any], worker: Worker | None = None) -> None:
        """Record the agent event ``name``, stamped with the time and the identity keys of
        :meth:`_construct_event` (run id, host, role, group rank, and ``worker``'s global
        rank), so run-scoped subscribers (``events.subscribe(run_id=...)``) see it.

        Never raises (a failing handler is logged); never blocks.
        """
        wg = self._worker_group
        spec = wg.spec
        self._record(
            Event(
                name,
                source=EventSource.AGENT,
                timestamp=int(time.time() * 1000),
                metadata={
                    "run_id": spec.rdzv_handler.get_run_id(),
                    "hostname": hostname(),
                    "role": spec.role,
                    "group_rank": wg.group_rank,
                    "global_rank": None if worker is None else worker.global_rank,
                    **metadata,
                },
            )
        )

    def get_event_failed(self, error: BaseException | None = None) -> Event:
        """The agent's FAILED event, ``raw_error`` being ``error``'s traceback (default:
        the exception being handled, as torch's)."""
        raw_error = (
            traceback.format_exc()
            if error is None
            else "".join(traceback.format_exception(type(error), error, error.__traceback__))
        )
        return self._construct_event("FAILED", EventSource.AGENT, raw_error=raw_error)

    def get_event_succeeded(self) -> Event:
        """The agent's SUCCEEDED event."""
        return self._construct_event("SUCCEEDED", EventSource.AGENT)

    def record_status(self, error: BaseException | None = None) -> None:
        """Record the run's final status to the spec's ``event_log_handler``, as torch's
        launcher does after ``agent.run()``: SUCCEEDED when the run returned (even with
        failed workers), FAILED (with ``error``'s traceback) when it raised.

        The launcher (:func:`aelastic.open_job`, hence ``launch``, ``elastic_launch``,
        ``launch_agent`` and ``aelastic run``) calls it once per run; code that runs an
        agent itself calls it likewise. Never raises (a failing handler is logged);
        never blocks.
        """
        self._record(self.get_event_succeeded() if error is None else self.get_event_failed(error))

    def _record_worker_events(self, result: RunResult) -> None:
        for worker in self._worker_group.workers:
            failure = result.failures.get(worker.global_rank)
            state = self._get_worker_state(worker, result)
            raw_error = json.dumps(failure.error_file_data) if failure else None
            exit_code = failure.exitcode if failure else None
            self._record(
                self._construct_event(
                    state, EventSource.WORKER, worker, raw_error, exit_code=exit_code
                )
            )

    def _get_worker_state(self, worker: Worker, result: RunResult) -> str:
        failure = result.failures.get(worker.global_rank)
        if result.state in (WorkerState.UNHEALTHY, WorkerState.FAILED) and not failure:
            return "TERMINATED"  # stopped by this agent after another worker failed
        return result.state.value

    def _construct_event(
        self,
        state: str,
        source: EventSource,
        worker: Worker | None = None,
        raw_error: str | None = None,
        duration_ms: float | None = None,
        exit_code: int | None = None,
    ) -> Event:
        """Build ``torchelastic.worker.status.<state>`` with torch's metadata keys."""
        wg = self._worker_group
        spec = wg.spec
        md: dict[str, Any] = {
            "group_world_size": wg.group_world_size,
            "entry_point": spec.get_entrypoint_name(),
        }
        global_rank: int | None = None
        worker_id: str | None = None
        if worker is not None:
            md["local_rank"] = (worker.local_rank,)
            md["role_rank"] = (worker.role_rank,)
            md["role_world_size"] = (worker.role_world_size,)
            md["exit_code"] = (exit_code,)
            md["worker_pid"] = (worker.id,)
            global_rank = worker.global_rank
            worker_id = None if worker.id is None else str(worker.id)
        metadata: dict[str, str | int | float | bool | None] = {
            "run_id": spec.rdzv_handler.get_run_id(),
            "global_rank": global_rank,
            "group_rank": wg.group_rank,
            "worker_id": worker_id,
            "role": spec.role,
            "hostname": hostname(),
            "state": state,
            "total_run_time": self._total_execution_time,
            "rdzv_backend": spec.rdzv_handler.get_backend(),
            "raw_error": raw_error,
            "metadata": json.dumps(md),
            "agent_restarts": restart_count(spec.max_restarts, self._remaining_restarts),
            "duration_ms": duration_ms,
        }
        return Event(f"torchelastic.worker.status.{state}", source=source, metadata=metadata)

    def _record_metrics(self, group_results: RunResult) -> None:
        """Seed 004's end-of-run metrics: run_total, success/failure x retries, flakiness."""
        is_failed = group_results.is_failed()
        spec = self._worker_group.spec
        role = spec.role
        restarts_happened = self._remaining_restarts != spec.max_restarts
        put_metric(
            f"workers.{role}.flakiness",
            flakiness(is_failed, spec.max_restarts, self._remaining_restarts),
        )
        put_metric(f"workers.{role}.run_total", 1)
        for name, condition in (
            ("run_success_with_retries", not is_failed and restarts_happened),
            ("run_success_no_retries", not is_failed and not restarts_happened),
            ("run_failed_with_retries", is_failed and restarts_happened),
            ("run_failed_no_retries", is_failed and not restarts_happened),
        ):
            self._record_metric_with_condition(name, condition)

    def _record_metric_with_condition(self, metric_name: str, condition: bool) -> None:
        put_metric(f"workers.{self._worker_group.spec.role}.{metric_name}", 1 if condition else 0)
