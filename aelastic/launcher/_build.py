"""From a :class:`LaunchConfig` to the objects that run it: rendezvous handler, spec, agent.

Plain builders: nothing here connects, starts or awaits, so every error they raise is a
setting (:class:`LaunchConfigError`). Never imports torch.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from .._ids import random_uuid4
from ._config import LaunchConfig
from ._exceptions import LaunchConfigError

if TYPE_CHECKING:
    from ..agent import LocalElasticAgent, WorkerSpec
    from ..nodes._gate import NodeGate
    from ..rendezvous import RendezvousHandler

__all__ = (
    "PreparedJob",
    "check_event_destination",
    "entrypoint_name",
    "make_agent",
    "make_handler",
    "make_spec",
    "parse_signals",
    "prepare_job",
)


def entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: Sequence[Any]) -> str:
    """The name used in logs and errors (torch's rule).

    A callable's ``__name__``; for the Python interpreter the first argument that is not
    an option (the script or module), ``""`` when there is none; otherwise the string
    itself.
    """
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", repr(entrypoint)))
    if entrypoint is None:
        return ""
    if os.path.basename(entrypoint).startswith("python") or entrypoint == sys.executable:
        names = [str(a) for a in args if not str(a).startswith("-")]
        if names[:1] == ["aelastic.errors._run_script"]:
            names = names[1:]  # run --run-path: name the script, not its runner
        return next(iter(names), "")
    return entrypoint


def _std(value: Any, nproc: int, name: str) -> Any:
    from ..workers._std import Std, to_map

    try:
        if isinstance(value, str):
            value = Std.from_str(value)
        elif isinstance(value, int) and not isinstance(value, Std):
            value = Std(value)
        return to_map(value, nproc)
    except ValueError as exc:
        raise LaunchConfigError(f"LaunchConfig.{name}: {exc}") from None


def parse_signals(spec: str) -> list[signal.Signals]:
    out: list[signal.Signals] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        sig = getattr(signal, full, None)
        if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise LaunchConfigError(
                f"LaunchConfig.signals_to_handle={spec!r}: {name!r} is not a trappable signal"
            )
        out.append(sig)
    return out


def check_event_destination(name: str) -> None:
    from ..events._dispatch import check_destination
    from ..events._exceptions import UnknownDestinationError

    try:
        check_destination(name)
    except UnknownDestinationError as exc:
        raise LaunchConfigError(f"event_log_handler={name!r}: {exc}") from None


def make_handler(config: LaunchConfig, run_id: str) -> RendezvousHandler:
    """The rendezvous handler of ``config`` (not entered).

    Raises:
        LaunchConfigError: ``node_rank_order`` names an environment variable that is
            unset or empty here.
        RendezvousError: other rendezvous settings (wrapped by :func:`prepare_job`).
    """
    from ..rendezvous import RendezvousParameters, get_rendezvous_handler

    extra: dict[str, Any] = {}
    if config.node_rank_order is not None:
        import socket

        from ..rendezvous._placement import rank_key

        try:
            rank_key(config.node_rank_order, socket.gethostname())
        except ValueError as exc:
            raise LaunchConfigError(str(exc)) from None
        extra["node_rank_order"] = config.node_rank_order
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
        **extra,
    )
    return get_rendezvous_handler(params)


def make_spec(
    config: LaunchConfig,
    handler: RendezvousHandler,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
    master: tuple[str, int] | None = None,
) -> WorkerSpec:
    """The agent's spec; ``master``: the workers' store endpoint (static rendezvous)."""
    from ..agent import WorkerSpec

    master_addr, master_port = master if master is not None else (None, None)
    # None: a fresh temp dir (made by aelastic.workers, torch's default); os.devnull: no
    # log or error files at all.
    log_dir = config.log_dir
    n = config.nproc_per_node
    return WorkerSpec(
        role=config.role,
        local_world_size=n,
        rdzv_handler=handler,
        entrypoint=entrypoint,
        args=tuple(args),
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
        redirects=_std(config.redirects, n, "redirects"),
        tee=_std(config.tee, n, "tee"),
        shutdown_timeout=config.resolved_shutdown_timeout(),
        exit_barrier_timeout=config.exit_barrier_timeout,
        log_dir=log_dir,
        local_ranks_filter=config.local_ranks_filter,
        log_line_prefix_template=config.log_line_prefix_template,
        event_log_handler=config.event_log_handler,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
        virtual_local_rank=config.virtual_local_rank,
        **config.hangs.spec_fields(),
        **config.restarts.spec_fields(),
        preload=config.preload.modules,
        preload_exclude=config.preload.exclude,
    )


def make_agent(
    config: LaunchConfig, spec: WorkerSpec, worker_ignored_signals: Collection[int] = ()
) -> LocalElasticAgent:
    """The agent; ``worker_ignored_signals``: what its workers start with ignored."""
    from ..agent import LocalElasticAgent

    return LocalElasticAgent(
        spec,
        worker_env_extra={
            **(config.env or {}),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": config.signals_to_handle,
        },
        worker_cwd=None if config.cwd is None else os.path.abspath(config.cwd),
        warm_workers=config.warm_workers,
        checkpoints=config.checkpoints,
        worker_ignored_signals=worker_ignored_signals,
    )


@dataclass(frozen=True)
class PreparedJob:
    """What :func:`prepare_job` built: the run id, the (un-entered) handler, the agent."""

    run_id: str
    name: str
    handler: RendezvousHandler
    agent: LocalElasticAgent
    #: health checks and exclusion before each round (None: neither is on)
    node_gate: NodeGate | None


def prepare_job(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
    worker_ignored_signals: Collection[int] = (),
) -> PreparedJob:
    """Check ``config`` against ``entrypoint`` and build the handler and the agent
    (whose workers start with ``worker_ignored_signals`` ignored).

    Nothing connects yet, so every error is a setting.

    Raises:
        LaunchConfigError: the entrypoint is empty, or a setting cannot work (the
            message names the field or ``--flag``).
    """
    from ..rendezvous import RendezvousError

    if entrypoint is None or (isinstance(entrypoint, str) and not entrypoint):
        raise LaunchConfigError("launch: the entrypoint is empty; pass a binary path or a callable")
    check_event_destination(config.event_log_handler)
    run_id = config.run_id or random_uuid4().replace("-", "")
    master: tuple[str, int] | None = None
    try:
        handler = make_handler(config, run_id)
        if config.rdzv_backend == "static":  # the workers' store is the rendezvous endpoint
            from ..rendezvous._params import parse_endpoint

            master = parse_endpoint(config.rdzv_endpoint, 29500)
    except LaunchConfigError:
        raise
    except (ValueError, RendezvousError) as exc:
        raise LaunchConfigError(
            f"invalid rendezvous settings (rdzv_backend, rdzv_endpoint, run_id, rdzv_configs; "
            f"--rdzv-* on the command line): {exc}"
        ) from None
    try:
        spec = make_spec(config, handler, entrypoint, args, master)
    except ValueError as exc:  # the agent's WorkerSpec checks
        if isinstance(exc, LaunchConfigError):
            raise
        raise LaunchConfigError(str(exc)) from None
    from ._node_args import gate_for

    agent = make_agent(config, spec, worker_ignored_signals)
    try:
        agent.node_gate = gate = gate_for(config)
    except ValueError as exc:  # the node gate's checks (NodeHealthConfigError)
        raise LaunchConfigError(str(exc)) from None
    return PreparedJob(run_id, entrypoint_name(entrypoint, args), handler, agent, gate)
