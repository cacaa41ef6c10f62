"""Rendezvous: how the agents of a job find each other and agree on ranks.

Public API of ``aelastic.rendezvous``; the implementation lives in private modules.
"""

from ._api import RendezvousHandler as RendezvousHandler
from ._api import RendezvousInfo as RendezvousInfo
from ._api import RendezvousStoreInfo as RendezvousStoreInfo
from ._exceptions import RendezvousClosedError as RendezvousClosedError
from ._exceptions import RendezvousClosedException as RendezvousClosedException
from ._exceptions import RendezvousConnectionError as RendezvousConnectionError
from ._exceptions import RendezvousError as RendezvousError
from ._exceptions import RendezvousGracefulExitError as RendezvousGracefulExitError
from ._exceptions import RendezvousNonRetryableError as RendezvousNonRetryableError
from ._exceptions import RendezvousStateError as RendezvousStateError
from ._exceptions import RendezvousTimeoutError as RendezvousTimeoutError
from ._exceptions import RendezvousTimeoutException as RendezvousTimeoutException

__all__ = (
    "RendezvousClosedError",
    "RendezvousClosedException",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousNonRetryableError",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "RendezvousTimeoutException",
)
