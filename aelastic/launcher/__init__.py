"""The launch API: run one node of a distributed job from Python.

``await aelastic.launch(config, entrypoint, *args)`` in an async program (a service
that orchestrates jobs), ``async with aelastic.open_job(config, entrypoint, *args) as
job:`` to watch and steer it while it runs (state, transitions, events, workers,
signals, health endpoint), ``aelastic.elastic_launch(config, entrypoint)(*args)`` from
synchronous code (``launch_agent(config, entrypoint, args)`` as in torch).
:class:`LaunchConfig` mirrors torch's ``torch.distributed.launcher.api.LaunchConfig``.
Never imports torch.

Modules, one job each: ``_config`` (:class:`LaunchConfig`), ``_args`` (``aelastic run``
flags -> config; a feature's flags are read beside its settings object, as in
``aelastic.progress._settings``; ``_restart_args`` and ``_node_args`` hold the groups
without one that can load while flags are parsed; ``_exceptions`` the launcher's
errors), ``_build`` (config -> rendezvous handler, spec, agent), ``_job`` (the
:class:`Job` handle), ``_launch`` (``launch`` and its synchronous forms), ``_cli``
(``python -m aelastic run``). Submodules load on first use (PEP 562): ``aelastic run``
imports this package before it parses its flags, and must reach the workers' pre-start
without anyio or the agent loaded (see ``_cli``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._exceptions import JobStoppedError as JobStoppedError
    from ._launch import launch_agent as launch_agent

__all__ = (
    "JobStoppedError",
    "launch_agent",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
