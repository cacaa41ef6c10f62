"""Keeping bad nodes out of a job: health checks before a node joins each round.

``--node-health-check CMD`` (repeatable), the entry-point group
``aelastic.health_checks`` (Python checks) and the built-in checks (log directory
writable with free space, free memory, GPUs through NVML when present) run before
the node joins each rendezvous round, each within ``--node-health-timeout``. A node
that fails one does not join, says why (log, ``aelastic.node.unhealthy`` event,
``/status``, ``/readyz``) and tries again after ``--node-health-cooldown``; when
the job ends without it, ``aelastic run`` exits with ``NODE_UNHEALTHY_EXIT_CODE``
(94). Decisions are plain functions (:mod:`._policy`); :class:`NodeGate` runs them.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._checks import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
    from ._checks import HealthCheck as HealthCheck
    from ._checks import builtin_checks as builtin_checks
    from ._checks import callable_check as callable_check
    from ._checks import command_check as command_check
    from ._checks import entry_point_checks as entry_point_checks
    from ._exceptions import NODE_UNHEALTHY_EXIT_CODE as NODE_UNHEALTHY_EXIT_CODE
    from ._exceptions import NodeHealthConfigError as NodeHealthConfigError
    from ._exceptions import NodeUnhealthyError as NodeUnhealthyError
    from ._gate import NodeGate as NodeGate
    from ._policy import CheckResult as CheckResult
    from ._policy import HealthReport as HealthReport

__all__ = (
    "CheckResult",
    "ENTRY_POINT_GROUP",
    "HealthCheck",
    "HealthReport",
    "NODE_UNHEALTHY_EXIT_CODE",
    "NodeGate",
    "NodeHealthConfigError",
    "NodeUnhealthyError",
    "builtin_checks",
    "callable_check",
    "command_check",
    "entry_point_checks",
)

_SOURCES = {
    "ENTRY_POINT_GROUP": "._checks",
    "HealthCheck": "._checks",
    "builtin_checks": "._checks",
    "callable_check": "._checks",
    "command_check": "._checks",
    "entry_point_checks": "._checks",
    "NODE_UNHEALTHY_EXIT_CODE": "._exceptions",
    "NodeHealthConfigError": "._exceptions",
    "NodeUnhealthyError": "._exceptions",
    "NodeGate": "._gate",
    "CheckResult": "._policy",
    "HealthReport": "._policy",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _SOURCES, __all__)
