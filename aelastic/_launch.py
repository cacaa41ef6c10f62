"""``await launch(config, entrypoint, *args)``: run one node of a job in the current event loop."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ._ids import random_uuid4
from ._launch_config import LaunchConfig, LaunchConfigError

if TYPE_CHECKING:
    from .agent import LocalElasticAgent, WorkerSpec
    from .rendezvous import RendezvousHandler

__all__ = ("elastic_launch", "entrypoint_name", "launch", "launch_agent", "run_launch")


def entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: Sequence[Any]) -> str:
    """The name used in logs and errors (torch's rule).

    A callable's ``__name__``; for the Python interpreter the first argument that is not
    an option (the script or module); otherwise the string itself.
    """
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", repr(entrypoint)))
    if entrypoint is None:
        return ""
    if os.path.basename(entrypoint).startswith("python") or entrypoint == sys.executable:
        names = [str(a) for a in args if not str(a).startswith("-")]
        if names[:1] == ["aelastic.errors._run_script"]:
            names = names[1:]  # run --run-path: name the script, not its runner
        return next(iter(names), entrypoint)
    return entrypoint


def _std(value: Any, nproc: int, name: str) -> Any:
    from .workers import Std, to_map

    try:
        if isinstance(value, str):
            value = Std.from_str(value)
        elif isinstance(value, int) and not isinstance(value, Std):
            value = Std(value)
        return to_map(value, nproc)
    except ValueError as exc:
        raise LaunchConfigError(f"LaunchConfig.{name}: {exc}") from None


def _signals(spec: str) -> list[signal.Signals]:
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


def _check_event_destination(name: str) -> None:
    from .events import UnknownDestinationError
    from .events._dispatch import registry

    try:
        registry.get(name)
    except UnknownDestinationError as exc:
        raise LaunchConfigError(f"event_log_handler={name!r}: {exc}") from None


def _make_handler(config: LaunchConfig, run_id: str) -> RendezvousHandler:
    from .rendezvous import RendezvousParameters, get_rendezvous_handler

    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    return get_rendezvous_handler(params)


def _make_spec(
    config: LaunchConfig,
    handler: RendezvousHandler,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
) -> WorkerSpec:
    from .agent import WorkerSpec

    master_addr: str | None = None
    master_port: int | None = None
    if config.rdzv_backend == "static":
        from .rendezvous import parse_endpoint

        master_addr, master_port = parse_endpoint(config.rdzv_endpoint, 29500)
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
    )


def _make_agent(config: LaunchConfig, spec: WorkerSpec) -> LocalElasticAgent:
    from .agent import LocalElasticAgent

    return LocalElasticAgent(
        spec,
        worker_env_extra={"TORCHELASTIC_SIGNALS_TO_HANDLE": config.signals_to_handle},
    )


async def run_launch(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
    *,
    handle_signals: bool = False,
) -> dict[int, Any]:
    """:func:`launch`, optionally trapping ``config.signals_to_handle`` (the CLI's path).

    With ``handle_signals`` the process's handlers for those signals are replaced while
    the launch runs (only the main thread may do this): each received signal makes the
    agent stop its workers with that signal, and :class:`aelastic.agent.SignalException`
    is raised once they are gone.
    """
    import anyio

    from .errors import ChildFailedError

    if entrypoint is None or (isinstance(entrypoint, str) and not entrypoint):
        raise LaunchConfigError("launch: the entrypoint is empty; pass a binary path or a callable")
    signals = _signals(config.signals_to_handle) if handle_signals else []
    _check_event_destination(config.event_log_handler)
    run_id = config.run_id or random_uuid4().replace("-", "")
    from .rendezvous import RendezvousError

    try:  # builds objects only: nothing connects yet, so every error here is a setting
        handler = _make_handler(config, run_id)
        if config.rdzv_backend == "static":
            from .rendezvous import parse_endpoint

            parse_endpoint(config.rdzv_endpoint, 29500)
    except (ValueError, RendezvousError) as exc:
        raise LaunchConfigError(
            f"invalid rendezvous settings (rdzv_backend, rdzv_endpoint, run_id, rdzv_configs; "
            f"--rdzv-* on the command line): {exc}"
        ) from None
    try:
        spec = _make_spec(config, handler, entrypoint, args)
    except ValueError as exc:  # the agent's WorkerSpec checks
        if isinstance(exc, LaunchConfigError):
            raise
        raise LaunchConfigError(str(exc)) from None
    async with handler:
        agent = _make_agent(config, spec)
        if signals:
            outcome: list[Any] = []

            async def run_agent(scope: anyio.CancelScope) -> None:
                try:
                    outcome.append(await agent.run())
                except Exception as exc:
                    outcome.append(exc)
                finally:
                    scope.cancel()

            with anyio.open_signal_receiver(*signals) as received:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_agent, tg.cancel_scope)
                    async for sig in received:
                        agent.send_signal(sig)
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            result = outcome[0]
        else:
            result = await agent.run()
    if result.is_failed():
        raise ChildFailedError(entrypoint_name(entrypoint, args), result.failures)
    return dict(result.return_values)


async def launch(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str, *args: Any
) -> dict[int, Any]:
    """Run this node's workers of a job and return ``{global_rank: return value}``.

    ``entrypoint`` is a binary or script path run as ``[entrypoint, *args]`` (return
    values are None), or a module-level callable run in a fresh interpreter (its
    return value must be JSON-serialisable). Joins the rendezvous ``config`` describes,
    restarts the group on failures (``max_restarts``) and on membership changes.

    Nothing process-global changes: no signal handler, no ``os.environ`` write
    (``TORCHELASTIC_SIGNALS_TO_HANDLE`` goes to the workers' environment only). Two
    launches may run concurrently in one event loop.

    Cancellation stops the workers (signal, then SIGKILL after the shutdown timeout),
    leaves the rendezvous and re-raises.

    Raises:
        aelastic.errors.ChildFailedError: a worker failed and the restart budget is spent.
        aelastic.rendezvous.RendezvousError: the rendezvous failed (timeout, closed, ...).
        LaunchConfigError: the configuration cannot work.
    """
    return await run_launch(config, entrypoint, args)


class elastic_launch:
    """``elastic_launch(config, entrypoint)(*args)``: :func:`launch` for synchronous callers.

    Runs its own event loop (``anyio.run``) and returns ``{global_rank: return value}``
    or raises as :func:`launch` does.

    Raises:
        RuntimeError: called from inside a running event loop; ``await launch(...)``
            there instead.
    """

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str) -> None:
        self._config = config
        self._entrypoint = entrypoint

    def __call__(self, *args: Any) -> dict[int, Any]:
        import anyio
        import sniffio

        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            pass
        else:
            raise RuntimeError(
                f"elastic_launch(...)() was called inside a running {library} event loop, "
                "where it would block the loop; use 'await aelastic.launch(config, "
                "entrypoint, *args)' instead"
            )
        return anyio.run(partial(launch, self._config, self._entrypoint, *args))


def launch_agent(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str, args: Sequence[Any]
) -> dict[int, Any]:
    """torch's ``launch_agent(config, entrypoint, args)``: ``elastic_launch(...)(*args)``."""
    return elastic_launch(config, entrypoint)(*args)
