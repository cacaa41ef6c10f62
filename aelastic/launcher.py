"""The launch API: run one node of a distributed job from Python.

``await aelastic.launch(config, entrypoint, *args)`` in an async program (a service
that orchestrates jobs), ``async with aelastic.open_job(config, entrypoint, *args) as
job:`` to watch and steer it while it runs (state, transitions, events, workers,
signals, health endpoint), ``aelastic.elastic_launch(config, entrypoint)(*args)`` from
synchronous code (``launch_agent(config, entrypoint, args)`` as in torch).
:class:`LaunchConfig` mirrors torch's ``torch.distributed.launcher.api.LaunchConfig``.
Never imports torch.
"""

from ._job import FailureInfo as FailureInfo
from ._job import Job as Job
from ._job import JobStoppedError as JobStoppedError
from ._job import StateChange as StateChange
from ._job import WorkerInfo as WorkerInfo
from ._job import open_job as open_job
from ._job import run_job as run_job
from ._launch import elastic_launch as elastic_launch
from ._launch import launch as launch
from ._launch import launch_agent as launch_agent
from ._launch_config import LaunchConfig as LaunchConfig
from ._launch_config import LaunchConfigError as LaunchConfigError

__all__ = (
    "FailureInfo",
    "Job",
    "JobStoppedError",
    "LaunchConfig",
    "LaunchConfigError",
    "StateChange",
    "WorkerInfo",
    "elastic_launch",
    "launch",
    "launch_agent",
    "open_job",
    "run_job",
)
