"""Errors of the node gate (health checks before a node joins a round)."""

from __future__ import annotations

from ..agent._exceptions import AgentError

__all__ = ("NODE_UNHEALTHY_EXIT_CODE", "NodeHealthConfigError", "NodeUnhealthyError")

#: ``aelastic run``'s exit status when this node was kept out by a failed health check
#: until the job ended (or its rendezvous went away): recycle or repair the host.
NODE_UNHEALTHY_EXIT_CODE = 94


class NodeHealthConfigError(AgentError, ValueError):
    """A health check setting cannot work (an empty command, a timeout <= 0...)."""


class NodeUnhealthyError(AgentError):
    """This node failed a health check and stayed out until the job ended without it.

    ``failed`` names the checks that failed on the last try, each with its reason.
    ``aelastic run`` exits with :data:`NODE_UNHEALTHY_EXIT_CODE` (94).
    """

    def __init__(self, msg: str, failed: tuple[str, ...] = ()) -> None:
        super().__init__(msg)
        self.failed = failed
