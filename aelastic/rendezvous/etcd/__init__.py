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
the handler raises :class:`~aelastic.rendezvous._exceptions.RendezvousUnsupportedLoopError` before
any I/O.
"""

from ._backend import EtcdRendezvousHandler as EtcdRendezvousHandler

__all__ = ("EtcdRendezvousHandler",)
