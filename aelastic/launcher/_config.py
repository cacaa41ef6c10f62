"""``LaunchConfig``: what one node of a job runs (torch's fields and defaults, plus a few)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from ..checkpoint._settings import CheckpointSettings
from ..health._settings import HealthSettings
from ..nodes._settings import BadNodeSettings
from ..progress._settings import HangSettings
from ..stragglers._settings import StragglerSettings
from ..workers._settings import PreloadSettings
from ._exceptions import LaunchConfigError
from ._restart_settings import RestartSettings

__all__ = ("DEFAULT_SIGNALS", "LaunchConfig")

#: The signals the agent traps and forwards to its workers by default (torchrun's set).
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

_DEFAULT_SHUTDOWN_TIMEOUT = 30.0
_DEFAULT_EXIT_BARRIER_TIMEOUT = 300.0
_DEFAULT_RDZV_TIMEOUT = 900


@dataclass
class LaunchConfig:
    """The settings of one node (agent) of a job: torch's ``LaunchConfig`` field for field.

    The fields and defaults are those of ``torch.distributed.launcher.api.LaunchConfig``
    (so ``rdzv_backend`` defaults to ``"etcd"`` and ``max_restarts`` to 3, as there;
    the ``run`` command passes torchrun's own defaults). aelastic adds
    ``exit_barrier_timeout``, ``log_dir``, ``redirects``, ``tee`` and
    ``local_ranks_filter``, which torch keeps in ``logs_specs`` and environment
    variables, and ``health`` (``HealthSettings``, from ``aelastic.health._settings``:
    ``port``, None: no endpoint, 0: a free port; ``host``, loopback unless another
    address is given): where the job's health and status endpoint (the job view's
    ``/status``) listens; it replaces the flat ``health_port`` and ``health_host``
    (docs/embedding.md, "Names"); ``master_addr``/``master_port`` of the static backend come from
    ``rdzv_endpoint`` as in torch.

    Bad nodes: ``bad_nodes`` (:class:`aelastic.BadNodeSettings`: ``health_checks``, shell
    commands run before the node joins each round, ``health_timeout``,
    ``health_cooldown``, ``builtin_checks``; ``exclude_after`` (0: off),
    ``exclude_window``, ``exclude_cooldown``, ``exclude_cooldown_max``: a node whose
    workers failed that many rounds within the window stays out of the next rounds for
    the cooldown, doubled on each repeat, capped); it replaces the flat ``node_health_*``
    and ``exclude_node_*`` fields (docs/bad-nodes.md, "Names"). See :mod:`aelastic.nodes`.

    ``node_rank_order`` (``--node-rank-order``): ``"hostname"`` or ``"env:VAR"``; group
    ranks follow that topology key (the store's host first); dynamic backends only
    (c10d, etcd). See docs/bad-nodes.md, "Group ranks stay where they were".

    Straggler detection: ``stragglers`` (:class:`aelastic.StragglerSettings`: ``action``
    ``"report"``, the default, ``"exclude"`` or ``"off"``; ``threshold``, ``window``,
    ``min_duration``, ``timeout``, ``warmup``); it replaces the flat ``straggler_*``
    fields (docs/stragglers.md, "Names"). See :mod:`aelastic.stragglers`.

    ``redirects`` and ``tee`` take what ``-r``/``-t`` take: ``0``-``3``, a string such as
    ``"3"`` or ``"0:1,1:2"``, an ``aelastic.workers.Std`` or a ``{local_rank: Std}`` map.

    Hang detection: ``hangs`` (``HangSettings``, from ``aelastic.progress._settings``:
    ``initial_heartbeat_timeout``, ``heartbeat_timeout``, ``section_timeouts``,
    ``out_of_section_timeout``, ``learn_timeouts``, each None: off), handed to
    :class:`~aelastic.agent.WorkerSpec`'s fields of the same names; it replaces the five
    flat fields (docs/hangs.md, "Names"). The restart policy: ``restarts``
    (:class:`aelastic.RestartSettings`: ``max_no_progress_restarts``, ``restart_backoff``,
    ``restart_backoff_max``, ``job_wide_restarts``, ``exit_grace``), handed to WorkerSpec's
    fields of the same names; it replaces those five flat fields (docs/hangs.md, "Names").

    ``preload`` (``PreloadSettings``: ``modules``, names or ``"auto"`` that idle warm
    interpreters import before a restart, and ``exclude``) goes to WorkerSpec's
    ``preload`` and ``preload_exclude``; it replaces the flat ``preload`` tuple and
    ``preload_exclude`` field (docs/preload.md, "Names").

    ``env`` is added to each worker's environment (over a copy of this process's
    ``os.environ``, under torch's variables such as ``RANK``); ``cwd`` is the workers'
    working directory (None: this process's; a relative path is taken from here);
    neither changes anything in this process, and warm interpreters are still used
    (unless ``env`` changes a variable the interpreter reads at start-up, such as
    ``PYTHONPATH``). ``warm_workers=False`` starts every worker as a fresh interpreter
    and keeps none idle (an 8-worker job then holds 8 processes, not 16);
    ``AELASTIC_WARM_WORKERS=0`` turns them off for every job.

    ``checkpoints`` (:class:`aelastic.CheckpointSettings`: ``dir``, ``persist_interval``,
    ``peer_copies``, ``job_secret_file``, ``requeue``) is where and how often the agent
    writes the newest :mod:`aelastic.checkpoint` step to disk, how many other nodes hold a
    copy of it, and whether a Slurm preemption requeues the job; it replaces the flat
    ``checkpoint_*`` fields (docs/checkpoints.md, "Names").

    ``shutdown_timeout`` of None means the environment variable
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 seconds; it is read when the launch
    starts, never written. Constructing a config changes nothing process-global, nor the
    caller's ``rdzv_configs`` dict (the config keeps its own copy, with ``timeout`` set).

    Raises:
        LaunchConfigError: from ``__post_init__`` when a field cannot work
            (``min_nodes`` > ``max_nodes``, a negative restart budget, ...).
    """

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: Any = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    event_log_handler: str = "null"
    numa_options: Any = None
    signals_to_handle: str = DEFAULT_SIGNALS
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    shutdown_timeout: float | None = None
    # aelastic additions
    exit_barrier_timeout: float = _DEFAULT_EXIT_BARRIER_TIMEOUT
    log_dir: str | None = None
    redirects: Any = 0
    tee: Any = 0
    local_ranks_filter: set[int] | None = None
    # hang detection (aelastic.progress): see docs/hangs.md
    hangs: HangSettings = field(default_factory=HangSettings)
    # restart policy (aelastic.agent._policy): see docs/hangs.md
    restarts: RestartSettings = field(default_factory=RestartSettings)
    # aelastic.checkpoint: the flags of --checkpoint-dir's group, checked when made
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    # the health and status endpoint (the job view's /status): see docs/embedding.md
    health: HealthSettings = field(default_factory=HealthSettings)
    # the workers' environment, working directory and interpreters (a service's jobs)
    env: dict[str, str] | None = None
    cwd: str | None = None
    warm_workers: bool = True

    # what warm interpreters import before a restart: see docs/preload.md
    preload: PreloadSettings = field(default_factory=PreloadSettings)
    # health checks before each round and exclusion after repeated failures: aelastic.nodes
    bad_nodes: BadNodeSettings = field(default_factory=BadNodeSettings)
    # group ranks by a topology key: see docs/bad-nodes.md, "Group ranks stay where they were"
    node_rank_order: str | None = None
    # slow nodes found while the job runs: see aelastic.stragglers (docs/stragglers.md)
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)

    def __post_init__(self) -> None:
        if not 0 < self.min_nodes <= self.max_nodes:
            raise LaunchConfigError(
                f"min_nodes={self.min_nodes}, max_nodes={self.max_nodes}: "
                "need 0 < min_nodes <= max_nodes"
            )
        if self.nproc_per_node < 1:
            raise LaunchConfigError(
                f"nproc_per_node={self.nproc_per_node}: need at least 1 worker per node"
            )
        if self.max_restarts < 0:
            raise LaunchConfigError(
                f"max_restarts={self.max_restarts}: need >= 0 (0 means no restart)"
            )
        if not isinstance(self.checkpoints, CheckpointSettings):
            raise LaunchConfigError(
                f"checkpoints={self.checkpoints!r}: need an aelastic.CheckpointSettings, "
                "such as CheckpointSettings(dir='/shared/ckpt')"
            )
        if self.monitor_interval <= 0:
            raise LaunchConfigError(
                f"monitor_interval={self.monitor_interval}: need a positive number of seconds"
            )
        if self.shutdown_timeout is not None and self.shutdown_timeout < 0:
            raise LaunchConfigError(
                f"shutdown_timeout={self.shutdown_timeout}: need >= 0 seconds (or None)"
            )
        if self.exit_barrier_timeout < 0:
            raise LaunchConfigError(
                f"exit_barrier_timeout={self.exit_barrier_timeout}: need >= 0 seconds"
            )
        if not isinstance(self.health, HealthSettings):
            raise LaunchConfigError(
                f"health={self.health!r}: need a HealthSettings (from aelastic.health._settings),"
                " such as HealthSettings(port=0)"
            )
        if self.env is not None:
            if not isinstance(self.env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                for k, v in self.env.items()
            ):
                raise LaunchConfigError(
                    f"env={self.env!r}: need a mapping of variable names to strings, "
                    "such as {'NCCL_DEBUG': 'INFO'}"
                )
            self.env = dict(self.env)  # the caller's dict stays as it was
        if self.cwd is not None and not os.path.isdir(self.cwd):
            raise LaunchConfigError(
                f"cwd={self.cwd!r}: not a directory; give the workers' working directory "
                "(an existing one) or None for this process's"
            )

        if not isinstance(self.preload, PreloadSettings):
            raise LaunchConfigError(
                f"preload={self.preload!r}: need a PreloadSettings (from "
                "aelastic.workers._settings), such as PreloadSettings(modules=('torch',))"
            )
        if not isinstance(self.hangs, HangSettings):
            raise LaunchConfigError(
                f"hangs={self.hangs!r}: need a HangSettings (from aelastic.progress._settings),"
                " such as HangSettings(heartbeat_timeout=60)"
            )
        if not isinstance(self.restarts, RestartSettings):
            raise LaunchConfigError(
                f"restarts={self.restarts!r}: need an aelastic.RestartSettings, "
                "such as RestartSettings(restart_backoff=5)"
            )
        if not isinstance(self.bad_nodes, BadNodeSettings):
            raise LaunchConfigError(
                f"bad_nodes={self.bad_nodes!r}: need an aelastic.BadNodeSettings, "
                "such as BadNodeSettings(health_checks=('nvidia-smi',))"
            )
        self._check_rank_order()
        self._check_stragglers()
        self.rdzv_configs = dict(self.rdzv_configs)  # the caller's dict stays as it was
        if self.rdzv_timeout is not None and self.rdzv_timeout != -1:
            self.rdzv_configs["timeout"] = self.rdzv_timeout
        else:
            self.rdzv_configs.setdefault("timeout", _DEFAULT_RDZV_TIMEOUT)

    def _check_rank_order(self) -> None:
        if self.node_rank_order is None:
            return
        from ..rendezvous._placement import check_rank_order

        try:
            self.node_rank_order = check_rank_order(
                self.node_rank_order, "LaunchConfig.node_rank_order"
            )
        except ValueError as exc:
            raise LaunchConfigError(str(exc)) from None
        if self.rdzv_backend == "static":
            raise LaunchConfigError(
                f"node_rank_order={self.node_rank_order!r} (--node-rank-order) applies to the "
                "dynamic rendezvous (--rdzv-backend c10d or etcd); with the static backend "
                "each node's rank is its --node-rank: drop --node-rank-order or pass "
                "--rdzv-backend c10d --rdzv-endpoint HOST:PORT"
            )

    def _check_stragglers(self) -> None:
        # the values were checked when the StragglerSettings was made; what is left is
        # how they meet another feature's (the rendezvous backend)
        if not isinstance(self.stragglers, StragglerSettings):
            raise LaunchConfigError(
                f"stragglers={self.stragglers!r}: need an aelastic.StragglerSettings, "
                "such as StragglerSettings(threshold=0.8)"
            )
        if self.stragglers.action == "exclude" and self.rdzv_backend == "static":
            raise LaunchConfigError(
                "stragglers.action='exclude' (--straggler-action exclude): the static rendezvous "
                "backend has a fixed membership, so no node can leave and none can take its "
                "place; use --rdzv-backend c10d (or etcd) with a spare node (more agents than "
                "--nnodes MAX) or --nnodes MIN:MAX to go on smaller, or --straggler-action report"
            )

    def resolved_shutdown_timeout(self, environ: Mapping[str, str] | None = None) -> float:
        """The grace seconds before SIGKILL: the field, else the env variable, else 30.

        Raises:
            LaunchConfigError: ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is not a number >= 0.
        """
        if self.shutdown_timeout is not None:
            return float(self.shutdown_timeout)
        env = os.environ if environ is None else environ
        raw = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        if not raw:
            return _DEFAULT_SHUTDOWN_TIMEOUT
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value < 0:
            raise LaunchConfigError(
                f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={raw!r}: need a number of seconds >= 0"
            )
        return value
