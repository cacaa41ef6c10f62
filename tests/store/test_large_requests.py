"""Requests as large as torch's server accepts are served by default, never cut off.

Memory is bounded by back-pressure (a connection over the shared budget is not
read), not by closing the connection.
"""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from aelastic.store import StoreServer, TCPStoreClient

from ._backends import on_every_backend

pytestmark = pytest.mark.timeout(120)

#: issue 20: 64 Ki keys of 800 B, a 51 MB MULTI_SET (under torch's 8 MiB / 128 Ki limits)
KEYS, VALUE_SIZE = 64 * 1024, 800

_TORCH_MULTI_SET = """
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False,
                      timeout=timedelta(seconds=60))
keys = [f"k{i}" for i in range({keys})]
store.multi_set(keys, [bytes([i % 251]) * {size} for i in range({keys})])
got = store.multi_get(keys[-3:])
print("ok", [len(v) for v in got], got[-1][:1] == bytes([({keys} - 1) % 251]), flush=True)
"""


async def test_torchs_51_mb_multi_set_is_served_with_default_limits() -> None:
    """torch's own client sends the 51 MB MULTI_SET; the server applies it (no reset)
    while another client keeps being answered."""
    script = _TORCH_MULTI_SET.replace("{keys}", str(KEYS)).replace("{size}", str(VALUE_SIZE))
    async with StoreServer() as server, TCPStoreClient(server.host, server.port) as other:
        args = [sys.executable, "-c", script, server.host, str(server.port)]
        with anyio.fail_after(90):
            done = await anyio.run_process(args, check=False)
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            assert done.stdout.decode().split() == ["ok", "[800,", "800,", "800]", "True"]
            await other.set("after", "1")
            assert await other.get(f"k{KEYS - 1}") == bytes([(KEYS - 1) % 251]) * VALUE_SIZE
        assert server.buffered_bytes == 0


@on_every_backend
async def test_concurrent_requests_over_the_budget_wait_instead_of_being_closed() -> None:
    """Two 51 MB MULTI_SETs at once, over a 48 MiB budget (the default): the newer one
    is not read until the older completes, and both are applied."""
    values = [b"v" * VALUE_SIZE] * KEYS
    async with (
        StoreServer() as server,
        TCPStoreClient(server.host, server.port) as a,
        TCPStoreClient(server.host, server.port) as b,
    ):
        assert server.limits.max_buffered_bytes < KEYS * VALUE_SIZE
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.multi_set, [f"a{i}" for i in range(KEYS)], values)
                tg.start_soon(b.multi_set, [f"b{i}" for i in range(KEYS)], values)
            await a.wait([f"a{KEYS - 1}", f"b{KEYS - 1}"])  # (MULTI_SET has no answer)
            assert await a.num_keys() == 2 * KEYS
            assert await b.get(f"a{KEYS - 1}") == values[0]
        assert server.buffered_bytes == 0


def test_the_store_cli_keeps_the_limits_as_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aelastic", "store", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--max-frame-size" in out and "--max-connection-buffer" in out
