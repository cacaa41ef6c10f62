"""Reads cancelled mid-flight leave etcd running: etcd 3.5.0-3.5.4 (the dev extra's is
3.5.1) panic and exit when a client cancels a read-only transaction that etcd is applying
(etcd#14110), so aelastic reads with plain ranges and never sends one."""

from __future__ import annotations

import random

import anyio
import pytest
from _etcd_server import EtcdServer

from aelastic.rendezvous.etcd._client import EtcdClient, op_range
from aelastic.rendezvous.etcd._store import EtcdStore


async def test_reads_cancelled_mid_flight_leave_etcd_running(
    etcd_client: EtcdClient, etcd_server: EtcdServer, run_id: str
) -> None:
    store = EtcdStore(etcd_client, f"/aelastic-test/{run_id}/", timeout=5)
    keys = [f"k{i}" for i in range(64)]
    await store.multi_set(keys, [b"x" * 1000] * len(keys))
    rng = random.Random(14110)
    cancelled = 0
    for _ in range(300):
        with anyio.move_on_after(rng.uniform(0, 0.004)) as scope:
            await store.multi_get(keys)
            await store.compare_set(keys[0], b"x" * 1000, b"x" * 1000)
        cancelled += scope.cancelled_caught
    assert cancelled > 50  # most reads were cut short somewhere inside
    assert etcd_server.proc is not None and etcd_server.proc.poll() is None, "etcd exited"
    assert await store.multi_get(keys[:2]) == [b"x" * 1000] * 2


async def test_a_read_only_transaction_is_refused(etcd_client: EtcdClient) -> None:
    with pytest.raises(ValueError, match="read-only etcd transaction"):
        await etcd_client.txn([], [op_range(b"k")])
