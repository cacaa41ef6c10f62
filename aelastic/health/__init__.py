"""The job's health and status endpoint (``--health-port``, ``LaunchConfig.health_port``).

``GET /healthz``, ``/readyz``, ``/status`` (JSON) and ``/metrics`` (Prometheus text),
served on an anyio listener (asyncio, uvloop, trio) with h11 parsing HTTP. Loopback
unless another address is configured.

Names load on first use (PEP 562): importing :class:`JobView` does not import h11.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._exceptions import HealthPortError as HealthPortError
    from ._http import Response as Response
    from ._http import Route as Route
    from ._server import ExtraRoute as ExtraRoute
    from ._server import serve_health as serve_health
    from ._server import serve_routes as serve_routes
    from ._view import JobView as JobView
    from ._view import WorkerView as WorkerView

__all__ = (
    "ExtraRoute",
    "HealthPortError",
    "JobView",
    "Response",
    "Route",
    "WorkerView",
    "serve_health",
    "serve_routes",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
