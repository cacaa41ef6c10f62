"""Rendezvous: how the agents of a job find each other and agree on ranks.

Public API of ``aelastic.rendezvous``; the implementation lives in private modules.
Backends: ``c10d`` (alias ``tcp``, the dynamic rendezvous on an aelastic TCPStore),
``static`` (fixed world), ``etcd``/``etcd-v2`` (:mod:`aelastic.rendezvous.etcd`, imported
only when an etcd handler is built) and plugins from the entry-point group
``aelastic.rendezvous``.
"""

from ._exceptions import RendezvousClosedError as RendezvousClosedError
from ._exceptions import RendezvousConnectionError as RendezvousConnectionError
from ._exceptions import RendezvousError as RendezvousError
from ._exceptions import RendezvousGracefulExitError as RendezvousGracefulExitError
from ._exceptions import RendezvousNonRetryableError as RendezvousNonRetryableError
from ._exceptions import RendezvousStateError as RendezvousStateError
from ._exceptions import RendezvousTimeoutError as RendezvousTimeoutError
from ._handler import RendezvousHandler as RendezvousHandler
from ._handler import RendezvousInfo as RendezvousInfo
from ._handler import RendezvousStoreInfo as RendezvousStoreInfo
from ._params import RendezvousParameters as RendezvousParameters
from ._registry import get_rendezvous_handler as get_rendezvous_handler
from ._registry import register as register
from ._registry import rendezvous_handler_registry as rendezvous_handler_registry

__all__ = (
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousNonRetryableError",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "get_rendezvous_handler",
    "register",
    "rendezvous_handler_registry",
)
