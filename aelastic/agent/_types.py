"""The agent's data objects: WorkerSpec, Worker, WorkerState, WorkerGroup, RunResult."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._exceptions import AgentConfigError

if TYPE_CHECKING:
    from ..errors import ProcessFailure
    from ..rendezvous import RendezvousHandler
    from ..store import Store
    from ..workers import Std

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

    ``INIT`` (created, not started) -> ``HEALTHY`` (running) -> ``SUCCEEDED`` (all exited 0)
    or ``FAILED`` (one exited non-zero and the budget is spent). ``STOPPED``: the agent
    stopped the group to restart it (a failure or a membership change). ``UNHEALTHY``:
    running but unhealthy. ``UNKNOWN``: the agent lost track (an error during a transition).
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
    from ..workers import Std

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
        monitor_interval: accepted for torchrun compatibility; unused (exits are
            noticed the moment they happen, nothing polls).
        master_port, master_addr: a fixed endpoint for the workers' store. With
            ``master_port`` unset the group-rank-0 agent hosts a fresh store per round
            on ``master_addr or local_addr`` (or loopback/hostname) and an ephemeral port.
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

    def __post_init__(self) -> None:
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
    observe it.
    """

    __slots__ = (
        "group_rank",
        "group_world_size",
        "master_addr",
        "master_port",
        "spec",
        "state",
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
        self.state = WorkerState.INIT


@dataclass
class RunResult:
    """The outcome of a run, all-or-nothing over this agent's local workers.

    ``return_values`` maps global rank to the return value (callable entrypoints; None
    for binaries) when the run succeeded; ``failures`` maps global rank to the
    :class:`~aelastic.errors.ProcessFailure` of each worker that failed on its own.
    Workers the agent stopped on purpose are in neither.
    """

    state: WorkerState
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)

    def is_failed(self) -> bool:
        """True only when ``state`` is FAILED."""
        return self.state == WorkerState.FAILED
