"""The agent's data objects: WorkerSpec, Worker, WorkerState, WorkerGroup, RunResult."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Set
from dataclasses import field
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from ._exceptions import AgentConfigError

if TYPE_CHECKING:
    from ..errors import ProcessFailure
    from ..progress._timeouts import ProgressTimeouts
    from ..rendezvous import RendezvousHandler
    from ..store import Store
    from ..workers._std import Std

__all__ = (
    "DEFAULT_ROLE",
    "RunResult",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
)

DEFAULT_ROLE = "default"


class WorkerState(str, enum.Enum):
    """State of a :class:`WorkerGroup`; the workers of a group change state as a unit.

    What the agent does, transition by transition:

    * ``INIT`` (created, not started) -> ``HEALTHY`` (the workers run) after each
      rendezvous and start;
    * ``HEALTHY`` -> ``SUCCEEDED``: every worker exited 0 (final);
    * ``HEALTHY`` -> ``FAILED``: a worker failed (exited non-zero, or hung and was
      stopped). With restarts left this is followed by ``STOPPED`` (the group stopped)
      and ``HEALTHY`` again (the next attempt): ``FAILED`` comes before **each**
      restart. With the budget spent it is final;
    * ``HEALTHY`` -> ``STOPPED`` -> ``HEALTHY``: a membership change restarted the group
      (no restart spent);
    * -> ``STOPPED`` (final): the run was stopped (cancelled, a terminating signal, a
      launcher's ``job.stop()``), also before the first start;
    * -> ``UNKNOWN`` (final): an error interrupted a transition (a rendezvous that
      failed, workers that could not be started or reaped).

    ``HEALTHY`` -> ``UNHEALTHY`` -> ``FAILED`` (final): a worker is stuck in
    uninterruptible sleep and the agent gives up on this host (torch ends at
    ``UNHEALTHY``; ``FAILED`` keeps a launcher from taking it for success).
    """

    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @staticmethod
    def is_running(state: WorkerState) -> bool:
        """Whether ``state`` means the worker processes exist (HEALTHY or UNHEALTHY)."""
        return state in (WorkerState.HEALTHY, WorkerState.UNHEALTHY)


def _std_none() -> Std:
    from ..workers._std import Std

    return Std.NONE


@dataclass
class WorkerSpec:
    """The blueprint of one role's workers on this node.

    Args:
        role: user-defined role name (``ROLE_NAME``).
        local_world_size: number of workers on this node (may differ between nodes).
        rdzv_handler: the rendezvous handler; the caller owns it (enters its context).
        entrypoint: a binary or script path run as ``[entrypoint, *args]``, or a
            picklable-by-reference Python callable run in a spawned interpreter.
        args: arguments of ``entrypoint`` (coerced with ``str`` for binaries).
        max_restarts: failures the agent restarts before returning FAILED.
        monitor_interval: how often a :class:`SimpleElasticAgent` subclass that only
            implements ``_monitor_workers`` is polled (torch's SimpleElasticAgent);
            :class:`LocalElasticAgent` ignores it (it notices exits the moment they
            happen, nothing polls).
        master_port, master_addr: a fixed endpoint for the workers' store. With
            ``master_port`` unset the group-rank-0 agent hosts a fresh store per round
            on ``master_addr or local_addr`` (or loopback/hostname) and an ephemeral port
            (a bare :class:`SimpleElasticAgent` subclass hosts none: it hands worker
            rank 0 a free port on that address, as torch's agent does).
        local_addr: this node's address, advertised for the hosted worker store.
        redirects, tee: std stream redirection and tee, for all or per local rank.
        shutdown_timeout: grace between the stop signal and SIGKILL, one deadline for all.
        exit_barrier_timeout: how long a node that succeeded waits for the others.
        log_dir: root of ``<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,
            stderr.log,error.json}`` (torchrun's layout): one run directory per agent,
            ``n`` the restart count; a second start with the same count (a membership
            restart) gets ``attempt_<n>_1``, so no logs are overwritten. None: a temporary
            directory; ``os.devnull``: no files and, like torchrun, no redirect, tee or
            ranks filter (``TORCHELASTIC_ERROR_FILE`` is empty).
        local_ranks_filter: local ranks whose tee'd output reaches the console (None: all).
        log_line_prefix_template: console prefix template (``${role_name}``, ``${rank}``,
            ``${local_rank}``); None: ``[role rank]:``.
        event_log_handler: events destination (``"null"``, ``"console"``...).
        duplicate_stdout_filters, duplicate_stderr_filters: substrings; every tee'd
            stdout (stderr) console line containing any of them is also appended, with
            its prefix, to ``attempt_<n>/filtered_stdout.log`` (``filtered_stderr.log``),
            one file per attempt for all local ranks (None or empty: no file).
        virtual_local_rank: every worker sees ``LOCAL_RANK=0`` and only its own device in
            ``CUDA_VISIBLE_DEVICES`` (the local_rank-th entry of the agent's list, else
            the local rank), as torchrun's ``--virtual-local-rank``.
        uninterruptible_state_timeout: seconds a running worker may stay continuously
            in uninterruptible sleep (Linux D-state) before the agent stops the workers
            and returns FAILED without restarting on this host (a hung GPU, NCCL, RDMA
            or network file system call: recycle the host). None: the
            ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT`` variable decides (unset: off);
            ``<= 0``: off. Off means no polling at all.
        initial_heartbeat_timeout, heartbeat_timeout, section_timeouts,
        out_of_section_timeout: hang detection for workers that report progress with
            :mod:`aelastic.progress` (see :class:`~aelastic.progress._timeouts.ProgressTimeouts`;
            all None: off). A worker past its deadline has its stacks (and its local
            peers') written to ``attempt_<n>/<local_rank>/stacks.txt``, then the group
            restarts like after a failure.
        max_no_progress_restarts: stop the job (exit code 93, "do not requeue") after
            this many consecutive failed attempts whose highest ``aelastic.progress.step``
            did not pass the best one before. None: off.
        restart_backoff: seconds to wait before the first restart after a failure,
            doubling with each consecutive failure up to ``restart_backoff_max``; 0
            (the default, torchrun's behaviour): restart at once.
        restart_backoff_max: the longest back-off, in seconds.
        job_wide_restarts: ``max_restarts`` counts the failures of the whole job (kept in
            the rendezvous store, one per failed round whichever node saw it) rather
            than this node's. Needs the c10d backend (others: per node, with a warning).
        learn_timeouts: a safety factor (e.g. 5): after a healthy attempt the agent
            proposes heartbeat/section timeouts of that many times the longest interval
            observed, persists them (log dir and store) and uses them from the next
            restart on. None: off.
        preload: module names (``"auto"``: learn them from the workers) that the idle
            warm interpreters import ahead of the next restart (Python script and
            ``-m`` workers only; see :mod:`aelastic.workers`). Empty: off.
        preload_exclude: modules (and their submodules) never preloaded.
        exit_grace: seconds a warm worker whose script ended (returned, ``sys.exit``,
            an uncaught exception) may spend in the interpreter's shutdown before it is
            reported, killed and counted with its script's exit status (a teardown that
            deadlocks must not keep a finished job waiting). None or ``<= 0``: no bound.

    String entrypoints' ``args`` go through torch's ``${local_rank}`` macro per worker.
    """

    role: str
    local_world_size: int
    rdzv_handler: RendezvousHandler
    entrypoint: str | Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    max_restarts: int = 3
    monitor_interval: float = 0.1
    master_port: int | None = None
    master_addr: str | None = None
    local_addr: str | None = None
    redirects: Std | Mapping[int, Std] = field(default_factory=_std_none)
    tee: Std | Mapping[int, Std] = field(default_factory=_std_none)
    shutdown_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    log_dir: str | os.PathLike[str] | None = None
    local_ranks_filter: Set[int] | None = None
    log_line_prefix_template: str | None = None
    event_log_handler: str = "null"
    fn: Callable[..., Any] | None = None
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    uninterruptible_state_timeout: float | None = None
    initial_heartbeat_timeout: float | None = None
    heartbeat_timeout: float | None = None
    section_timeouts: Mapping[str, float] | None = None
    out_of_section_timeout: float | None = None
    max_no_progress_restarts: int | None = None
    restart_backoff: float = 0.0
    restart_backoff_max: float = 300.0
    job_wide_restarts: bool = False
    learn_timeouts: float | None = None
    preload: tuple[str, ...] = ()
    preload_exclude: tuple[str, ...] = ()
    exit_grace: float | None = 60.0

    def __post_init__(self) -> None:
        from ..workers._preload import parse_preload

        try:
            self.preload = parse_preload(self.preload, "WorkerSpec.preload")
            self.preload_exclude = parse_preload(self.preload_exclude, "WorkerSpec.preload_exclude")
        except ValueError as exc:
            raise AgentConfigError(str(exc)) from None
        if self.fn is not None:
            if self.entrypoint is not None:
                raise AgentConfigError("WorkerSpec: pass entrypoint or fn (deprecated), not both")
            self.entrypoint = self.fn
        if self.entrypoint is None or (
            not isinstance(self.entrypoint, str) and not callable(self.entrypoint)
        ):
            raise AgentConfigError(
                f"WorkerSpec.entrypoint must be a binary/script path (str) or a callable,"
                f" got {self.entrypoint!r}"
            )
        if isinstance(self.entrypoint, str) and not self.entrypoint:
            raise AgentConfigError("WorkerSpec.entrypoint is an empty string; name a binary")
        if not isinstance(self.local_world_size, int) or self.local_world_size <= 0:
            raise AgentConfigError(
                f"WorkerSpec.local_world_size must be a positive int, got {self.local_world_size!r}"
            )
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise AgentConfigError(
                f"WorkerSpec.max_restarts must be an int >= 0, got {self.max_restarts!r}"
            )
        if self.monitor_interval <= 0:
            raise AgentConfigError(
                f"WorkerSpec.monitor_interval must be > 0, got {self.monitor_interval!r}"
            )
        for name in ("shutdown_timeout", "exit_barrier_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise AgentConfigError(f"WorkerSpec.{name} must be seconds >= 0, got {value!r}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise AgentConfigError(
                f"WorkerSpec.master_port must be in 1..65535, got {self.master_port!r}"
            )
        if not self.role:
            raise AgentConfigError("WorkerSpec.role must be a non-empty string")
        for name in ("duplicate_stdout_filters", "duplicate_stderr_filters"):
            needles = getattr(self, name)
            if needles is not None and (
                isinstance(needles, str | bytes) or not all(isinstance(n, str) for n in needles)
            ):
                raise AgentConfigError(
                    f"WorkerSpec.{name} must be a list of substrings such as ['loss'],"
                    f" got {needles!r}"
                )
        timeout = self.uninterruptible_state_timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or timeout != timeout  # NaN
        ):
            raise AgentConfigError(
                f"WorkerSpec.uninterruptible_state_timeout must be seconds or None, got {timeout!r}"
            )
        self.args = tuple(self.args)
        self._check_progress_fields()

    def _check_progress_fields(self) -> None:
        from ..progress._exceptions import ProgressTimeoutError

        try:
            self.progress_timeouts()
        except ProgressTimeoutError as exc:
            raise AgentConfigError(f"WorkerSpec: {exc}") from None
        n = self.max_no_progress_restarts
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise AgentConfigError(
                f"WorkerSpec.max_no_progress_restarts must be an int >= 1 or None, got {n!r}"
            )
        for name in ("restart_backoff", "restart_backoff_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise AgentConfigError(f"WorkerSpec.{name} must be seconds >= 0, got {value!r}")
        factor = self.learn_timeouts
        if factor is not None and (
            isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1
        ):
            raise AgentConfigError(
                f"WorkerSpec.learn_timeouts must be a safety factor > 1 (e.g. 5) or None,"
                f" got {factor!r}"
            )

    def progress_timeouts(self) -> ProgressTimeouts:
        """The hang-detection timeouts of this spec (``.enabled`` False: off)."""
        from ..progress._timeouts import ProgressTimeouts

        return ProgressTimeouts(
            initial=self.initial_heartbeat_timeout,
            heartbeat=self.heartbeat_timeout,
            sections=dict(self.section_timeouts or {}),
            out_of_section=self.out_of_section_timeout,
        )

    def get_entrypoint_name(self) -> str:
        """The binary's base name, or the callable's ``__qualname__``."""
        if isinstance(self.entrypoint, str):
            return os.path.basename(self.entrypoint)
        assert self.entrypoint is not None
        return str(getattr(self.entrypoint, "__qualname__", repr(self.entrypoint)))


class Worker:
    """One worker process of a :class:`WorkerGroup` (``id`` is its pid once started).

    Global and role ranks are reassigned by every rendezvous: they are not stable
    across restarts.
    """

    __slots__ = ("global_rank", "id", "local_rank", "role_rank", "role_world_size", "world_size")

    def __init__(
        self,
        local_rank: int,
        global_rank: int = -1,
        role_rank: int = -1,
        world_size: int = -1,
        role_world_size: int = -1,
    ) -> None:
        self.id: Any = None
        self.local_rank = local_rank
        self.global_rank = global_rank
        self.role_rank = role_rank
        self.world_size = world_size
        self.role_world_size = role_world_size

    def __repr__(self) -> str:
        return (
            f"Worker(local_rank={self.local_rank}, global_rank={self.global_rank},"
            f" role_rank={self.role_rank}, world_size={self.world_size},"
            f" role_world_size={self.role_world_size}, id={self.id!r})"
        )

    __str__ = __repr__


class WorkerGroup:
    """The workers of one :class:`WorkerSpec` on this node, and their shared state.

    ``store`` is the current round's rendezvous store; ``master_addr``/``master_port``
    the workers' store endpoint. Mutated by the agent as it runs: read ``state`` to
    observe it, or :meth:`add_state_listener` to be told of every change (nothing polls).
    """

    __slots__ = (
        "_listeners",
        "_state",
        "group_rank",
        "group_world_size",
        "master_addr",
        "master_port",
        "spec",
        "store",
        "workers",
    )

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.workers = [Worker(local_rank=i) for i in range(spec.local_world_size)]
        self.store: Store | None = None
        self.group_rank: int | None = None
        self.group_world_size: int | None = None
        self.master_addr: str | None = None
        self.master_port: int | None = None
        self._listeners: tuple[Callable[[WorkerGroup, WorkerState], None], ...] = ()
        self._state = WorkerState.INIT

    @property
    def state(self) -> WorkerState:
        """The group's current state; setting a different one calls the state listeners."""
        return self._state

    @state.setter
    def state(self, value: WorkerState) -> None:
        previous, self._state = self._state, value
        if value is not previous:
            for listener in self._listeners:
                listener(self, previous)

    def add_state_listener(self, listener: Callable[[WorkerGroup, WorkerState], None]) -> None:
        """Call ``listener(group, previous_state)`` right after each change of :attr:`state`.

        It runs synchronously in the agent's task, in the event loop, at the moment of
        the change: it must be quick and must not block or raise (an exception would
        abort the agent's transition).
        """
        self._listeners = (*self._listeners, listener)

    def remove_state_listener(self, listener: Callable[[WorkerGroup, WorkerState], None]) -> None:
        """Stop calling ``listener`` (no error if it was not added).

        Compared by equality, not identity: ``obj.method`` makes a new bound method
        each time it is read, equal to (not the same object as) the one added.
        """
        self._listeners = tuple(x for x in self._listeners if x != listener)


@dataclass
class RunResult:
    """The outcome of a run, all-or-nothing over this agent's local workers.

    ``return_values`` maps global rank to the return value (callable entrypoints; None
    for binaries) when the run succeeded; ``failures`` maps global rank to the
    :class:`~aelastic.errors.ProcessFailure` of each worker that failed on its own.
    Workers the agent stopped on purpose are in neither. ``no_progress``: the job was
    stopped by ``max_no_progress_restarts`` (do not requeue it). ``notes``: lines for
    the failure summary (the nodes excluded during the job, see ``aelastic.nodes``).
    """

    state: WorkerState
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    no_progress: bool = False
    notes: list[str] = field(default_factory=list)

    def is_failed(self) -> bool:
        """True only when ``state`` is FAILED."""
        return self.state == WorkerState.FAILED
