"""The etcd backend over TLS with client certificates (protocol/cacert/cert/key)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import anyio
import pytest
from _etcd_server import EtcdServer, make_certs, require_etcd, running_etcd
from test_etcd_rendezvous import make

from aelastic.rendezvous import RendezvousConnectionError


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    binary = require_etcd()
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make test certificates")
    with running_etcd(binary, tls=make_certs(tmp_path_factory.mktemp("certs"))) as server:
        yield server


async def test_rendezvous_over_tls(tls_etcd: EtcdServer, run_id: str) -> None:
    assert tls_etcd.tls is not None
    tls = tls_etcd.tls
    conf = {"protocol": "https", "cacert": tls["ca"], "cert": tls["client_cert"]}
    async with make(tls_etcd.endpoint, run_id, 1, 1, key=tls["client_key"], **conf) as h:
        with anyio.fail_after(10):
            info = await h.next_rendezvous()
        await info.store.set("k", "v")
        assert await info.store.get("k") == b"v"


async def test_plaintext_client_against_tls_etcd_fails_clearly(
    tls_etcd: EtcdServer, run_id: str
) -> None:
    async with make(tls_etcd.endpoint, run_id, 1, 1, join_timeout=1, read_timeout=5) as h:
        with anyio.fail_after(5), pytest.raises(RendezvousConnectionError, match="unreachable"):
            await h.next_rendezvous()
