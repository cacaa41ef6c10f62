"""Fixtures: a real etcd on free loopback ports, started once per module."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _etcd_server import EtcdServer, require_etcd, running_etcd

if importlib.util.find_spec("aetcd") is None:  # the 'etcd' extra is not installed
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    with running_etcd(require_etcd()) as server:
        yield server


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    etcd_server.ensure_running()  # a previous test stopped it, or it died
    return etcd_server.endpoint


@pytest.fixture
def run_id() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def etcd_client(etcd_endpoint: str) -> AsyncIterator[object]:
    from aelastic.rendezvous.etcd._client import EtcdClient, EtcdConfig, parse_endpoints

    async with EtcdClient(EtcdConfig(tuple(parse_endpoints(etcd_endpoint)), read_timeout=10)) as c:
        yield c
