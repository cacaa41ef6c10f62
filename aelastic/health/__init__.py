"""The job's health and status endpoint (``--health-port``, ``LaunchConfig.health_port``).

``GET /healthz``, ``/readyz``, ``/status`` (JSON) and ``/metrics`` (Prometheus text),
served on an anyio listener (asyncio, uvloop, trio) with h11 parsing HTTP. Loopback
unless another address is configured. The report functions are usable on their own.
"""

from ._exceptions import HealthPortError as HealthPortError
from ._report import is_ready as is_ready
from ._report import metrics_text as metrics_text
from ._report import status as status
from ._server import serve_health as serve_health
from ._view import JobView as JobView
from ._view import WorkerView as WorkerView

__all__ = (
    "HealthPortError",
    "JobView",
    "WorkerView",
    "is_ready",
    "metrics_text",
    "serve_health",
    "status",
)
