"""The etcd rendezvous backend (``--rdzv-backend etcd``, alias ``etcd-v2``) and its parts.

* :class:`EtcdRendezvousHandler` / :func:`create_etcd_handler` - the rendezvous itself
  (etcd leases for liveness, watches instead of polling);
* :class:`EtcdStore` - aelastic's :class:`~aelastic.store.Store` on etcd v3 (the agents'
  store of a round);
* :class:`EtcdClient` / :class:`EtcdConfig` - a small async etcd v3 client with endpoint
  failover, TLS, user/password auth and resuming watches.

Needs the ``etcd`` extra (``pip install 'aelastic[etcd]'``): importing this package
without it raises ImportError saying so. It is never imported by
``import aelastic.rendezvous``; the registry imports it the first time an ``etcd``
handler is built. Runs on anyio's asyncio backend only (``grpc.aio``): on another one
the handler raises :class:`~aelastic.rendezvous.RendezvousUnsupportedLoopError` before
any I/O.
"""

from ._backend import EtcdRendezvousHandler as EtcdRendezvousHandler
from ._backend import create_etcd_handler as create_etcd_handler
from ._client import EtcdClient as EtcdClient
from ._client import EtcdConfig as EtcdConfig
from ._client import EtcdWatch as EtcdWatch
from ._client import parse_endpoints as parse_endpoints
from ._client import prefix_end as prefix_end
from ._exceptions import EtcdCompactedError as EtcdCompactedError
from ._exceptions import EtcdRequestError as EtcdRequestError
from ._settings import EtcdRendezvousSettings as EtcdRendezvousSettings
from ._store import EtcdStore as EtcdStore

__all__ = (
    "EtcdClient",
    "EtcdCompactedError",
    "EtcdRequestError",
    "EtcdConfig",
    "EtcdRendezvousHandler",
    "EtcdRendezvousSettings",
    "EtcdStore",
    "EtcdWatch",
    "create_etcd_handler",
    "parse_endpoints",
    "prefix_end",
)
