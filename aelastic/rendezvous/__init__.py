"""Rendezvous: how the agents of a job find each other and agree on ranks.

Public API of ``aelastic.rendezvous``; the implementation lives in private modules.
Backends: ``c10d`` (alias ``tcp``, the dynamic rendezvous on an aelastic TCPStore),
``static`` (fixed world), ``etcd``/``etcd-v2`` (:mod:`aelastic.rendezvous.etcd`, imported
only when an etcd handler is built) and plugins from the entry-point group
``aelastic.rendezvous``.
"""

from ._c10d import C10dRendezvousHandler as C10dRendezvousHandler
from ._c10d import is_local_address as is_local_address
from ._dynamic import DynamicRendezvousHandler as DynamicRendezvousHandler
from ._exceptions import RendezvousClosedError as RendezvousClosedError
from ._exceptions import RendezvousClosedException as RendezvousClosedException
from ._exceptions import RendezvousConfigError as RendezvousConfigError
from ._exceptions import RendezvousConnectionError as RendezvousConnectionError
from ._exceptions import RendezvousEndpointError as RendezvousEndpointError
from ._exceptions import RendezvousError as RendezvousError
from ._exceptions import RendezvousGracefulExitError as RendezvousGracefulExitError
from ._exceptions import RendezvousNonRetryableError as RendezvousNonRetryableError
from ._exceptions import RendezvousStateError as RendezvousStateError
from ._exceptions import RendezvousTimeoutError as RendezvousTimeoutError
from ._exceptions import RendezvousTimeoutException as RendezvousTimeoutException
from ._exceptions import RendezvousUnsupportedLoopError as RendezvousUnsupportedLoopError
from ._handler import RendezvousHandler as RendezvousHandler
from ._handler import RendezvousInfo as RendezvousInfo
from ._handler import RendezvousStoreInfo as RendezvousStoreInfo
from ._liveness import Liveness as Liveness
from ._liveness import TickClock as TickClock
from ._params import DEFAULT_C10D_PORT as DEFAULT_C10D_PORT
from ._params import RendezvousParameters as RendezvousParameters
from ._params import parse_endpoint as parse_endpoint
from ._placement import check_rank_order as check_rank_order
from ._placement import rank_key as rank_key
from ._registry import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ._registry import RendezvousHandlerRegistry as RendezvousHandlerRegistry
from ._registry import create_handler as create_handler
from ._registry import get_rendezvous_handler as get_rendezvous_handler
from ._registry import register as register
from ._registry import rendezvous_handler_registry as rendezvous_handler_registry
from ._settings import DynamicSettings as DynamicSettings
from ._static import StaticRendezvousHandler as StaticRendezvousHandler

__all__ = (
    "C10dRendezvousHandler",
    "DEFAULT_C10D_PORT",
    "DynamicRendezvousHandler",
    "DynamicSettings",
    "ENTRY_POINT_GROUP",
    "Liveness",
    "RendezvousClosedError",
    "RendezvousClosedException",
    "RendezvousConfigError",
    "RendezvousConnectionError",
    "RendezvousEndpointError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousNonRetryableError",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "RendezvousTimeoutException",
    "RendezvousUnsupportedLoopError",
    "StaticRendezvousHandler",
    "TickClock",
    "check_rank_order",
    "create_handler",
    "get_rendezvous_handler",
    "is_local_address",
    "parse_endpoint",
    "rank_key",
    "register",
    "rendezvous_handler_registry",
)
