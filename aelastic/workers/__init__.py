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
    from ._exceptions import WorkerProcessError as WorkerProcessError
    from ._exceptions import WorkerStartError as WorkerStartError
    from ._processes import open_worker_processes as open_worker_processes
    from ._spec import ProcessSpec as ProcessSpec
    from ._std import Std as Std

__all__ = (
    "ProcessSpec",
    "Std",
    "WorkerProcessError",
    "WorkerStartError",
    "open_worker_processes",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
