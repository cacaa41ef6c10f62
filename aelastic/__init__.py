"""aelastic: an asyncio-native elastic launcher for PyTorch distributed jobs.

Importing aelastic never imports torch. Subpackages: ``aelastic.store``,
``aelastic.rendezvous``, ``aelastic.agent``, ``aelastic.workers``,
``aelastic.errors``, ``aelastic.events``, ``aelastic.metrics``; the launch API
(``LaunchConfig``, ``launch``, ``elastic_launch``) is in ``aelastic.launcher``.
"""

from ._exceptions import AelasticError as AelasticError

__version__ = "0.1.0"

__all__ = ("AelasticError", "__version__")
