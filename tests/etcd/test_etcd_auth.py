"""The etcd backend with user/password authentication (its own etcd with auth enabled)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from _etcd_server import EtcdServer, require_etcd, running_etcd
from test_etcd_rendezvous import make

from aelastic.rendezvous import RendezvousConnectionError, RendezvousStateError


@pytest.fixture(scope="module")
def auth_etcd() -> Iterator[EtcdServer]:
    binary = require_etcd()
    etcdctl = str(Path(binary).with_name("etcdctl"))
    with running_etcd(binary) as server:
        for args in (["user", "add", "root:rootpw"], ["auth", "enable"]):
            subprocess.run(
                [etcdctl, f"--endpoints={server.endpoint}", *args],
                check=True,
                capture_output=True,
                timeout=20,
            )
        yield server


async def test_rendezvous_with_username_and_password(auth_etcd: EtcdServer, run_id: str) -> None:
    async with make(auth_etcd.endpoint, run_id, 1, 1, username="root", password="rootpw") as h:
        with anyio.fail_after(10):
            info = await h.next_rendezvous()
        await info.store.set("k", "v")
        assert await info.store.get("k") == b"v"


async def test_wrong_password_is_a_clear_error(auth_etcd: EtcdServer, run_id: str) -> None:
    async with make(auth_etcd.endpoint, run_id, 1, 1, user="root", password="nope") as h:
        with (
            anyio.fail_after(10),
            pytest.raises(
                (RendezvousStateError, RendezvousConnectionError), match="authentication failed"
            ),
        ):
            await h.next_rendezvous()
