"""``python -m aelastic store``: ready line, clients, clean signal shutdown, bad flags."""

from __future__ import annotations

import signal
import subprocess
import sys

import anyio
import pytest

from aelastic.store import TCPStoreClient
from aelastic.store._cli import main


async def test_store_process_serves_clients(store_server_process: tuple[str, int]) -> None:
    host, port = store_server_process
    assert host == "127.0.0.1" and port > 0
    async with TCPStoreClient(host, port, timeout=10) as client:
        await client.set("k", "v")
        assert await client.get("k") == b"v"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_shuts_down_cleanly(sig: signal.Signals, loop: str) -> None:
    """On each event loop: serves a client, and a signal stops it with exit code 0."""
    async with await anyio.open_process(
        [sys.executable, "-m", "aelastic", "store", "--port", "0", "--loop", loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(30):
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive(1)
        assert line.startswith(b"aelastic store listening on 127.0.0.1:")
        port = int(line.decode().rsplit(":", 1)[1])
        async with TCPStoreClient("127.0.0.1", port, timeout=10) as client:
            await client.set("k", "v")
            assert await client.get("k") == b"v"
            proc.send_signal(sig)
            with anyio.fail_after(20):
                assert await proc.wait() == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["--port", "x"],
        ["--port", "70000"],
        ["--max-key-size", "0"],
        ["--log-level", "LOUD"],
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aelastic store: ")


def test_non_loopback_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--allow-non-loopback" in err and err.count("\n") == 1
