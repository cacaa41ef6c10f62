"""aelastic: an asyncio-native elastic launcher for PyTorch distributed jobs.

Importing aelastic never imports torch. Subpackages: ``aelastic.store``,
``aelastic.rendezvous``, ``aelastic.agent``, ``aelastic.workers``,
``aelastic.errors``, ``aelastic.events``, ``aelastic.metrics``, ``aelastic.progress``
(the workers' progress reporting for hang detection), ``aelastic.checkpoint`` (checkpoints
in memory the agent owns), ``aelastic.health``; the launch API
(``LaunchConfig``, ``launch``, ``open_job``, ``elastic_launch``) is in ``aelastic.launcher``.
"""

from ._exceptions import AelasticError as AelasticError
from ._lazy import lazy_exports

__version__ = "0.1.0"

__all__ = (
    "AelasticError",
    "Job",
    "LaunchConfig",
    "__version__",
    "elastic_launch",
    "launch",
    "open_job",
    "run_job",
)

# The launch API is loaded on first use, so ``import aelastic`` stays light.
_LAZY = {
    "LaunchConfig": "aelastic.launcher",
    "elastic_launch": "aelastic.launcher",
    "launch": "aelastic.launcher",
    "open_job": "aelastic.launcher",
    "run_job": "aelastic.launcher",
    "Job": "aelastic.launcher",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
