"""What a :class:`~aelastic.Job` says about itself: its live state, read from
the agent and the job's watchers (the node gate, the straggler watch), and the history
of its transitions the agent pushes.

:class:`JobView` holds the job's state (its constructor sets every attribute the job's
parts read) and the read-only accessors. Every accessor is called from the event loop
running the job, none blocks, none raises (a missing part reads as None or empty).
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._net import node_name
from ._build import PreparedJob
from ._config import LaunchConfig
from ._job_records import FailureInfo, HangInfo, StateChange, WorkerInfo

if TYPE_CHECKING:
    from ..agent import RunResult, WorkerGroup, WorkerState
    from ..errors import ProcessFailure
    from ..events._subscribe import EventStream
    from ..jobview._publish import StatusPublisher
    from ..progress._reader import ProgressSnapshot
    from ..stragglers import SlowInterval
    from ..stragglers._watch import StragglerWatch

__all__ = ("JobView",)

#: State transitions a :class:`Job` keeps for late readers of :meth:`Job.state_changes`.
_HISTORY = 1_000
#: Events a :class:`Job` keeps for late subscribers of :meth:`Job.events`.
_EVENT_BACKLOG = 1_000


class JobView:
    """A job's state and its read-only accessors (a part of :class:`Job`)."""

    def __init__(self, config: LaunchConfig, prepared: PreparedJob) -> None:
        self.config = config
        #: the run id shared by every node (``config.run_id`` or a fresh one)
        self.run_id = prepared.run_id
        #: the entrypoint's name, as in errors and logs
        self.name = prepared.name
        #: ``(host, port)`` of the health endpoint, when ``config.health.port`` is set
        self.health_address: tuple[str, int] | None = None
        #: this node's host name, as reported by ``/status``
        self.node = node_name()
        self._prepared = prepared
        self._agent = prepared.agent
        self._history: collections.deque[StateChange] = collections.deque(maxlen=_HISTORY)
        self._changes = 0  # transitions ever recorded (the index after the last one)
        self._changed = anyio.Event()
        self._done = anyio.Event()
        self._outcome: RunResult | BaseException | None = None
        #: cancelled by :meth:`stop` (made now: a stop before the job's task runs counts)
        self._run_scope = anyio.CancelScope()
        self._stop_requested = False
        #: True while the node enters its rendezvous (connects to the store, which may
        #: take up to read_timeout): the agent's run has not begun to take a signal.
        self._entering = False
        self._entry_signal: signal.Signals | None = None
        self._events_source: EventStream | None = None  # the job's registry subscription
        self._event_backlog: collections.deque[Any] = collections.deque(maxlen=_EVENT_BACKLOG)
        self._event_streams: list[EventStream] = []  # subscribers fed from the backlog on
        self._events_ended = False
        self._last_failure: FailureInfo | None = None
        #: the agent's ``last_failures`` mapping ``_last_failure`` was made from
        self._failures_seen: Mapping[int, ProcessFailure] = self._agent.last_failures
        self._last_hang: HangInfo | None = None
        #: hangs found and stacks written so far (from the job's own events)
        self.hang_count = 0
        self.stacks_captured = 0
        #: the heartbeat timeout ``learn_timeouts`` learned, in seconds (None: none yet)
        self.learned_heartbeat_timeout: float | None = None
        #: publishes this node's status into the rendezvous store (``aelastic.jobview``)
        self.status_publisher: StatusPublisher | None = None
        #: set before the run ends: read the job's view at the end (``aelastic run``'s
        #: goodput line, the job's); the view read, None if it could not be
        self._want_end_view = False
        self._end_view: dict[str, Any] | None = None
        #: finds this node's slow ranks (``aelastic.stragglers``; None: detection off)
        self.straggler_watch: StragglerWatch | None = None
        group = self._agent.get_worker_group()
        self._push(group.state, None)
        group.add_state_listener(self._on_state)

    @property
    def state(self) -> WorkerState:
        """The worker group's state now (``INIT``, ``HEALTHY``, ``STOPPED``...)."""
        return self._agent.get_worker_group().state

    @property
    def role(self) -> str:
        """The workers' role (``config.role``)."""
        return self._agent.get_worker_group().spec.role

    @property
    def round(self) -> int | None:
        """The rendezvous round of the current workers (None before the first)."""
        return self._agent.rendezvous_round

    @property
    def remaining_restarts(self) -> int:
        """Failures that may still be restarted."""
        return self._agent.remaining_restarts

    @property
    def restart_count(self) -> int:
        """Failures restarted so far."""
        from ..agent._policy import restart_count

        return restart_count(self.config.max_restarts, self._agent.remaining_restarts)

    @property
    def last_failure(self) -> FailureInfo | None:
        """A failed worker of the last attempt that failed (None: none failed yet).

        Known once that attempt's workers are stopped (the agent's ``last_failures``):
        a hung worker is named with the code it was stopped with.
        """
        self._take_failures()
        return self._last_failure

    @property
    def last_hang(self) -> HangInfo | None:
        """The last hung worker the agent found (None: none hung so far)."""
        return self._last_hang

    def heartbeat_age_ms(self) -> int | None:
        """Milliseconds since the stalest last heartbeat of the running workers (None:
        no running worker uses ``aelastic.progress`` heartbeats)."""
        return self._agent.heartbeat_age_ms()

    def idle_interpreters(self) -> tuple[int, int]:
        """Idle warm worker interpreters: how many, and their resident memory in bytes."""
        return self._agent.idle_interpreters()

    @property
    def log_dir(self) -> str | None:
        """This node's log directory of the job, ``<log_dir>/<run_id>_<random>``: the
        ``attempt_<n>`` directories of the workers' output and error files.

        None before the first workers start, and with ``log_dir=os.devnull``. With
        ``config.log_dir`` None it is a fresh temporary directory, removed when the job
        ends as far as it holds no file (nothing is left of a job that wrote nothing).
        """
        return self._agent.log_run_dir

    @property
    def history(self) -> tuple[StateChange, ...]:
        """The state transitions so far, oldest first (the last 1000): a snapshot.

        Readable at any time, also after the ``open_job`` block: once :attr:`done`,
        the last item is the job's final state (``SUCCEEDED``, ``FAILED``, ``STOPPED``
        when it was stopped or let go by the rendezvous, ``UNKNOWN`` when an error
        ended it), which a watcher inside the block may not live to see.
        """
        return tuple(self._history)

    def checkpoint_status(self) -> dict[str, Any] | None:
        """This node's :mod:`aelastic.checkpoint` state: memory directory, bytes held,
        the step the workers resumed from, the last step written to ``checkpoint_dir``
        (None outside the run). A listing and a few ``stat`` calls in ``/dev/shm``."""
        checkpoints = self._agent.checkpoints
        return None if checkpoints is None else checkpoints.status()

    @property
    def group_rank(self) -> int | None:
        """This node's rank among the nodes of the current round (None before the first)."""
        return self._agent.get_worker_group().group_rank

    def progress(self) -> dict[int, ProgressSnapshot]:
        """``{local_rank: ProgressSnapshot}`` of the running workers' ``aelastic.progress``
        reports (every round has progress files; empty between rounds)."""
        return self._agent.progress_snapshots()

    def goodput(self) -> dict[str, Any] | None:
        """Where this node's time went since the launch (:mod:`aelastic.goodput`):
        ``{"wall_s", "productive_s", "ratio", "badput_s": {category: s}, "steps_kept",
        "steps_lost"}`` (steps None when the workers report none); None before the run
        starts. The whole job's (every node's, combined) is ``aelastic status --json``'s."""
        ledger = self._agent.goodput.ledger()
        return None if ledger is None else ledger.record()

    def goodput_summary(self) -> str | None:
        """This node's ledger as one line: ``goodput 96.1% of 312.0 s: restart 2.1 s (2), ...``."""
        ledger = self._agent.goodput.ledger()
        return None if ledger is None else ledger.summary()

    def node_health(self) -> dict[str, Any] | None:
        """The last health check pass before a round (``/status``'s ``node_health``):
        ``{"healthy", "checked_at", "strikes", "checks": [...]}``; None: no checks."""
        gate = self._prepared.node_gate
        report = None if gate is None else gate.report
        return None if report is None else report.as_dict()

    def unhealthy_reason(self) -> str | None:
        """Why this node is kept out of the job (a failed health check), else None."""
        gate = self._prepared.node_gate
        if gate is None or gate.report is None or gate.report.healthy:
            return None
        return gate.report.reason()

    def straggler_status(self) -> dict[str, Any] | None:
        """This node's straggler scores and verdict (``/status``'s ``stragglers``):
        ``{"action", "threshold", "scores": {rank: {"relative", "individual"}}, "slow":
        None or {"ranks": {rank: score}, "whole_node", "since"}, "slow_seconds"}``;
        None when detection is off."""
        watch = self.straggler_watch
        return None if watch is None else watch.status()

    def slow_intervals(self) -> list[SlowInterval]:
        """This node's stretches of being slow (a straggler), oldest first, wall clock:
        what a goodput ledger counts as time spent slow. [] when detection is off."""
        watch = self.straggler_watch
        return [] if watch is None else list(watch.intervals)

    @property
    def done(self) -> bool:
        """Whether the job has finished (:meth:`wait` returns or raises at once)."""
        return self._done.is_set()

    def workers(self) -> list[WorkerInfo]:
        """The local workers of the current (or last) attempt, by local rank."""
        group = self._agent.get_worker_group()
        attempt = self._agent.attempt
        dests = self._agent.log_destinations
        out = []
        for w in group.workers:
            rank = w.local_rank
            out.append(
                WorkerInfo(
                    local_rank=rank,
                    global_rank=w.global_rank,
                    role_rank=w.role_rank,
                    world_size=w.world_size,
                    pid=w.id,
                    attempt=attempt,
                    stdout=None if dests is None else dests.stdouts.get(rank),
                    stderr=None if dests is None else dests.stderrs.get(rank),
                    error_file=None if dests is None else dests.error_files.get(rank),
                )
            )
        return out

    def _on_state(self, group: WorkerGroup, previous: WorkerState) -> None:
        self._take_failures()
        self._push(group.state, previous)

    def _push(self, state: WorkerState, previous: WorkerState | None) -> None:
        agent = self._agent
        self._history.append(
            StateChange(
                state=state,
                previous=previous,
                round=agent.rendezvous_round,
                attempt=agent.attempt,
                restart_count=self.restart_count,
                remaining_restarts=agent.remaining_restarts,
                timestamp=time.time(),
            )
        )
        self._changes += 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _take_failures(self) -> None:
        """Note the failure the agent published, if new (at most once per failed round).

        Called at each transition, so a failure is noted with the attempt it ended
        (the agent publishes it before leaving ``FAILED``, and the next attempt starts
        after that), and when read.
        """
        failures = self._agent.last_failures
        if failures is self._failures_seen or not failures:
            return
        self._failures_seen = failures
        global_rank, failure = min(failures.items(), key=lambda item: item[1].local_rank)
        self._last_failure = FailureInfo(
            local_rank=failure.local_rank,
            global_rank=global_rank,
            pid=failure.pid,
            exitcode=failure.exitcode,
            attempt=self._agent.attempt,
            timestamp=time.time(),
        )
