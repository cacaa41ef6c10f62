"""Worker processes for the agent: start, watch, stop, logs, signals, callables.

:func:`open_worker_processes` starts one process per :class:`ProcessSpec`,
each in its own process group and (Linux) dying with the agent, reports each
exit the moment it happens, and stops and reaps everything on leaving its
block, also on cancellation. :class:`LogDestinations` lays out the per-attempt
log directory; :func:`callable_process_args` runs a Python callable in a
spawned interpreter with JSON arguments and result; :func:`open_warm_pool`
keeps Python worker interpreters pre-started so a (re)start skips their
start-up (``AELASTIC_WARM_WORKERS=0`` turns it off) and, with ``preload``, has
them import the job's modules while idle (``--preload``). Never imports torch.

Submodules load on first use (PEP 562), so ``aelastic run`` can pre-start the
workers' interpreters (:func:`prestart_warm_workers`) before asyncio and the rest
of this package are imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._callable import callable_process_args as callable_process_args
    from ._callable import read_callable_result as read_callable_result
    from ._console import console_writer as console_writer
    from ._exceptions import CallableResultError as CallableResultError
    from ._exceptions import NoMoreExitsError as NoMoreExitsError
    from ._exceptions import WorkerProcessError as WorkerProcessError
    from ._exceptions import WorkerStartError as WorkerStartError
    from ._logs import LogDestinations as LogDestinations
    from ._logs import make_run_log_dir as make_run_log_dir
    from ._logs import remove_empty_log_dirs as remove_empty_log_dirs
    from ._logs import run_dir as run_dir
    from ._preload import parse_preload as parse_preload
    from ._processes import WorkerProcesses as WorkerProcesses
    from ._processes import open_worker_processes as open_worker_processes
    from ._procfs import process_state as process_state
    from ._procfs import thread_busy_seconds as thread_busy_seconds
    from ._signals import DEFAULT_SIGNALS_TO_HANDLE as DEFAULT_SIGNALS_TO_HANDLE
    from ._signals import open_signal_forwarder as open_signal_forwarder
    from ._signals import parse_signals as parse_signals
    from ._spec import ProcessExit as ProcessExit
    from ._spec import ProcessSpec as ProcessSpec
    from ._std import Std as Std
    from ._std import parse_std_spec as parse_std_spec
    from ._std import to_map as to_map
    from ._warm import WARM_WORKERS_ENV as WARM_WORKERS_ENV
    from ._warm import PythonEntry as PythonEntry
    from ._warm import WarmPool as WarmPool
    from ._warm import open_warm_pool as open_warm_pool
    from ._warm import parse_python_argv as parse_python_argv
    from ._warm import prestart_warm_workers as prestart_warm_workers
    from ._warm import warm_workers_enabled as warm_workers_enabled

__all__ = (
    "DEFAULT_SIGNALS_TO_HANDLE",
    "WARM_WORKERS_ENV",
    "CallableResultError",
    "LogDestinations",
    "NoMoreExitsError",
    "ProcessExit",
    "ProcessSpec",
    "PythonEntry",
    "Std",
    "WorkerProcessError",
    "WorkerProcesses",
    "WarmPool",
    "WorkerStartError",
    "callable_process_args",
    "console_writer",
    "make_run_log_dir",
    "open_signal_forwarder",
    "open_warm_pool",
    "open_worker_processes",
    "parse_preload",
    "parse_python_argv",
    "parse_signals",
    "parse_std_spec",
    "prestart_warm_workers",
    "process_state",
    "read_callable_result",
    "remove_empty_log_dirs",
    "run_dir",
    "thread_busy_seconds",
    "to_map",
    "warm_workers_enabled",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
