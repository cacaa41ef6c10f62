"""Errors of the node gate (health checks before a node joins a round)."""

from __future__ import annotations

from .._exceptions import ConfigError, show_public_module
from ..agent import AgentError

__all__ = (
    "NODE_EXCLUDED_EXIT_CODE",
    "NODE_UNHEALTHY_EXIT_CODE",
    "NodeExcludedError",
    "NodeUnhealthyError",
)

#: ``aelastic run``'s exit status when this node was kept out by a failed health check
#: until the job ended (or its rendezvous went away): recycle or repair the host.
NODE_UNHEALTHY_EXIT_CODE = 94
#: ``aelastic run``'s exit status when this node was excluded after repeated failures
#: (``--exclude-node-after``) and the job ended without it.
NODE_EXCLUDED_EXIT_CODE = 95


class NodeHealthConfigError(AgentError, ConfigError):
    """A health check setting cannot work (an empty command, a timeout <= 0...)."""


class NodeUnhealthyError(AgentError):
    """This node failed a health check and stayed out until the job ended without it.

    ``failed`` names the checks that failed on the last try, each with its reason.
    ``aelastic run`` exits with :attr:`exit_code`: :data:`NODE_UNHEALTHY_EXIT_CODE` (94).
    """

    exit_code = NODE_UNHEALTHY_EXIT_CODE
    #: how ``aelastic run`` names this outcome on stderr
    kind = "unhealthy node"

    def __init__(self, msg: str, failed: tuple[str, ...] = ()) -> None:
        super().__init__(msg)
        self.failed = failed


class NodeExcludedError(NodeUnhealthyError):
    """This node was excluded after repeated failures (``--exclude-node-after``) and the
    job ended while it was out. ``aelastic run`` exits with 95."""

    exit_code = NODE_EXCLUDED_EXIT_CODE
    kind = "excluded node"


show_public_module(__name__, globals())
