"""The launch API: run one node of a distributed job from Python.

``await aelastic.launch(config, entrypoint, *args)`` in an async program (a service
that orchestrates jobs), ``aelastic.elastic_launch(config, entrypoint)(*args)`` from
synchronous code (``launch_agent(config, entrypoint, args)`` as in torch).
:class:`LaunchConfig` mirrors torch's ``torch.distributed.launcher.api.LaunchConfig``.
Never imports torch.
"""

from ._launch import elastic_launch as elastic_launch
from ._launch import launch as launch
from ._launch import launch_agent as launch_agent
from ._launch_config import LaunchConfig as LaunchConfig
from ._launch_config import LaunchConfigError as LaunchConfigError

__all__ = ("LaunchConfig", "LaunchConfigError", "elastic_launch", "launch", "launch_agent")
