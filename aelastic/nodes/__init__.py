"""Keeping bad nodes out of a job: health checks and exclusion after repeated failures.

``--node-health-check CMD`` (repeatable), the entry-point group
``aelastic.health_checks`` (Python checks) and the built-in checks (log directory
writable with free space, free memory, GPUs through NVML when present) run before
the node joins each rendezvous round, each within ``--node-health-timeout``. A node
that fails one does not join, says why (log, ``aelastic.node.unhealthy`` event,
``/status``, ``/readyz``) and tries again after ``--node-health-cooldown``; when
the job ends without it, ``aelastic run`` exits with ``NODE_UNHEALTHY_EXIT_CODE``
(94). ``--exclude-node-after N``: a node whose workers failed N rounds (or hung)
within ``--exclude-node-window`` stays out for ``--exclude-node-cooldown`` (doubled
on each repeat, capped), published job-wide in the rendezvous store and as an
``aelastic.node.excluded`` event; exit 95 if the job ends meanwhile. Decisions are
plain functions (:mod:`._policy`); :class:`NodeGate` runs them.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._checks import HealthCheck as HealthCheck
    from ._exceptions import NODE_UNHEALTHY_EXIT_CODE as NODE_UNHEALTHY_EXIT_CODE
    from ._exceptions import NodeExcludedError as NodeExcludedError
    from ._exceptions import NodeUnhealthyError as NodeUnhealthyError
    from ._exclusion import excluded_nodes as excluded_nodes
    from ._policy import CheckResult as CheckResult

__all__ = (
    "CheckResult",
    "HealthCheck",
    "NODE_UNHEALTHY_EXIT_CODE",
    "NodeExcludedError",
    "NodeUnhealthyError",
    "excluded_nodes",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
