"""The whole job at a glance: every node's status in the rendezvous store, and its readers.

Each agent publishes a small, bounded status of its node (:class:`StatusPublisher`,
started by :func:`aelastic.open_job`): node id, host, state, round, ranks, restarts,
workers with their last ``aelastic.progress`` step and heartbeat age, last failure
and hang, and a short history (steps over time; restarts, hangs, node losses and
any other kind of mark). Readers: ``python -m aelastic status`` (a table, or
``--json``), ``python -m aelastic dashboard`` and ``GET /`` of the health endpoint
(a live page with charts). Works on the c10d and etcd backends; a c10d store
re-hosted after its host was lost is followed.

Names load on first use (PEP 562): the agent's status publisher does not import the
HTTP side (h11, the page) unless the health endpoint is on.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._exceptions import JobViewError as JobViewError
    from ._view import read_view as read_view
    from ._view import summarize as summarize

__all__ = (
    "JobViewError",
    "read_view",
    "summarize",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
