"""Import what a job needs off the event loop, before the job starts.

The launcher's API module imports the agent, rendezvous, store, events and workers
lazily (a service that never opens a job does not pay for them). The first
:func:`~aelastic.open_job` of a process would then import them on the
service's event loop, blocking it for 70-190 ms. :func:`import_off_loop` imports
them in a worker thread first; the loop keeps running (an import holds the GIL only
in slices, like any Python code).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import anyio.to_thread

from .._dataclass import dataclass
from .._features import feature_modules

if TYPE_CHECKING:
    from ._config import LaunchConfig

__all__ = ("JOB_MODULES", "import_now", "import_off_loop", "job_modules")

#: Every module a local job imports (the agent and what it runs); the etcd backend, the
#: health endpoint, hang detection and the file timer are added by :func:`job_modules`
#: when the job uses them.
JOB_MODULES = (
    "aelastic.store",
    "aelastic.rendezvous",
    "aelastic.rendezvous._c10d",
    "aelastic.rendezvous._static",
    "aelastic.events",
    "aelastic.errors",
    "aelastic.agent",
    "aelastic.agent._local",
    "aelastic.workers._processes",
    "aelastic.workers._warm",
    "aelastic.workers._callable",
    "aelastic.checkpoint._agent",
    "aelastic.jobview._publish",  # the status publisher (the HTTP side only with a health port)
    # the node gate that prepare_job builds (health checks, exclusion)
    "aelastic.launcher._node_args",
    "aelastic.nodes._checks",
    "aelastic.nodes._exclusion",
    "aelastic.nodes._gate",
    "aelastic.nodes._policy",
    # straggler detection, on by default (aelastic.stragglers)
    "aelastic.stragglers._policy",
    "aelastic.stragglers._signal",
    "aelastic.stragglers._watch",
)


def job_modules(config: LaunchConfig) -> tuple[str, ...]:
    """What a job of ``config`` will import: :data:`JOB_MODULES` and its optional parts."""
    http = ("aelastic.health._server", "aelastic.jobview._http")
    extra: tuple[str, ...] = http if config.health.port is not None else ()
    if config.rdzv_backend.startswith("etcd"):
        extra += ("aelastic.rendezvous.etcd",)
    if os.environ.get("KUBEFLOW_TRAINER_SERVER_URL"):  # a TrainJob's pod: progress is posted
        extra += ("aelastic.schedulers",)
    hangs = _HangFields(
        **config.hangs.spec_fields(),
        max_no_progress_restarts=config.restarts.max_no_progress_restarts,
    )
    return JOB_MODULES + extra + feature_modules(hangs, os.environ)


@dataclass(frozen=True)
class _HangFields:
    """A config's hang detection as :func:`aelastic._features.feature_modules` reads it
    (``LaunchConfig.hangs`` and the no-progress stop, flat as on ``WorkerSpec``)."""

    initial_heartbeat_timeout: float | None
    heartbeat_timeout: float | None
    section_timeouts: Mapping[str, float] | None
    out_of_section_timeout: float | None
    learn_timeouts: float | None
    max_no_progress_restarts: int | None


def import_now(names: Iterable[str]) -> None:
    """Import the modules ``names`` in this thread; raises what an import raises.

    For a launcher before its event loop runs (``python -m aelastic run``): its job then
    finds everything imported and :func:`import_off_loop` needs no thread, whose start
    and hand-offs would sit on the way to the workers' start.
    """
    for name in names:
        importlib.import_module(name)


async def import_off_loop(names: Iterable[str] = JOB_MODULES) -> None:
    """Import the modules ``names`` not imported yet, in a worker thread.

    Returns at once (no thread) when all are imported. Raises what an import raises.
    Cancellation: waits for the imports under way to finish (bounded: an import).
    """
    missing = [name for name in names if name not in sys.modules]
    if missing:
        await anyio.to_thread.run_sync(import_now, missing)
