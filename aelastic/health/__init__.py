"""The job's health and status endpoint (``--health-port``, ``LaunchConfig.health``).

``GET /healthz``, ``/readyz``, ``/status`` (JSON) and ``/metrics`` (Prometheus text),
served on an anyio listener (asyncio, uvloop, trio) with h11 parsing HTTP. Loopback
unless another address is configured.

Names load on first use (PEP 562): importing :class:`JobView` does not import h11.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._view import JobView as JobView

__all__ = ("JobView",)

__getattr__, __dir__ = lazy_exports(__name__, globals())
