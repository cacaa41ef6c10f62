"""Async key-value stores that speak torch's TCPStore protocol.

* :class:`Store` - the async interface (torch's Store operations);
* :class:`StoreServer` - a TCPStore-compatible server (torch clients work against it);
* :class:`TCPStoreClient` - an async client (works against ours and torch's server);
* :meth:`Store.ephemeral` - writes the server performs when a client's connection
  closes (process death noticed at once; an aelastic extension of the protocol);
* :class:`LocalStore` - in-process store; :class:`PrefixStore` - namespaced view;
* :func:`barrier`, :func:`synchronize`, :func:`get_all` - coordination helpers.
"""

from ._client import TCPStoreClient as TCPStoreClient
from ._exceptions import StoreClosedError as StoreClosedError
from ._exceptions import StoreConnectionError as StoreConnectionError
from ._exceptions import StoreError as StoreError
from ._exceptions import StoreTimeoutError as StoreTimeoutError
from ._interface import Store as Store
from ._local import LocalStore as LocalStore
from ._prefix import PrefixStore as PrefixStore
from ._server import StoreServer as StoreServer
from ._utils import barrier as barrier
from ._utils import get_all as get_all
from ._utils import synchronize as synchronize

__all__ = (
    "LocalStore",
    "PrefixStore",
    "Store",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreServer",
    "StoreTimeoutError",
    "TCPStoreClient",
    "barrier",
    "get_all",
    "synchronize",
)
