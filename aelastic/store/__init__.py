"""Async key-value stores that speak torch's TCPStore protocol.

Public API of ``aelastic.store``; the implementation lives in private modules.
"""

from ._api import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from ._api import Store as Store
from ._api import Value as Value
from ._exceptions import ProtocolError as ProtocolError
from ._exceptions import QueueEmptyError as QueueEmptyError
from ._exceptions import StoreClosedError as StoreClosedError
from ._exceptions import StoreConnectionError as StoreConnectionError
from ._exceptions import StoreError as StoreError
from ._exceptions import StoreLimitError as StoreLimitError
from ._exceptions import StoreTimeoutError as StoreTimeoutError

__all__ = (
    "DEFAULT_TIMEOUT",
    "ProtocolError",
    "QueueEmptyError",
    "Store",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreLimitError",
    "StoreTimeoutError",
    "Value",
)
