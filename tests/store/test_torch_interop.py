"""Wire compatibility with torch: torch's client on our server, our client on torch's server.

torch is imported only in subprocesses (a torch client blocked on its socket holds
the GIL, which would starve an in-process server). The operations' runs share one such
interpreter (:func:`torch_ops`): each import of torch costs ~2 s of CPU, seven of them
did the same thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic.store import StoreServer, StoreTimeoutError, TCPStoreClient
from aelastic.store._exceptions import QueueEmptyError

from ._backends import on_every_backend
from ._torch_ops import OPS, encode

HERE = Path(__file__).parent
TORCH_OPS = str(HERE / "_torch_ops.py")

# What torch's own client reports against torch's own libuv server (checked below too).
EXPECTED: list[Any] = [
    None, "31", 5, 3, "33", "78", "65", False, "79", "79", "79", True, False, True, False,
    False, None, None, "7879", None, ["7632", "7631"], None, "", True, None, None, 2, True,
    "6531", "6532", "<empty>", 0, "<timeout>", "<timeout>", None, 6,
    ["ap", "c", "cs", "e", "m1", "m2"],
]  # fmt: skip

pytestmark = pytest.mark.timeout(90)


async def run_our_ops(store: TCPStoreClient) -> list[Any]:
    results: list[Any] = []
    for op, *args in OPS:
        try:
            if op == "get_timeout":
                value: Any = await store.get(args[0], timeout=args[1])
            elif op == "wait":
                await store.wait(args[0], timeout=args[1])
                value = None
            elif op == "queue_pop":
                value = await store.queue_pop(args[0], block=args[1])
            elif op == "list_keys":
                value = sorted(await store.list_keys())
            else:
                value = await getattr(store, op)(*args)
        except QueueEmptyError:
            value = "<empty>"
        except StoreTimeoutError:
            value = "<timeout>"
        results.append(encode(value))
    return results


class TorchOps:
    """``_torch_ops.py loop``: one interpreter with torch imported, asked one line at a time.

    :meth:`ask` blocks (run it in a thread from async code); an interpreter that died
    fails the test asking, with its stderr's tail."""

    def __init__(self, proc: subprocess.Popen[str], stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr

    def ask(self, *command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(command) + "\n")
        self.proc.stdin.flush()
        return self.line()

    def line(self) -> str:
        """Its next line on stdout."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.stderr.read_text()[-3000:]
            raise AssertionError(f"_torch_ops.py loop exited: {tail}")
        return line.strip()

    def results(self, *command: str) -> list[Any]:
        result: list[Any] = json.loads(self.ask(*command))
        return result


@pytest.fixture(scope="module")
def torch_ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchOps]:
    """One ``_torch_ops.py loop`` for the module, ready (torch imported); stopped by
    closing its stdin, killed if it has not exited 30 s later. Its stderr goes to a file
    (a pipe nobody reads could fill and block it)."""
    stderr = tmp_path_factory.mktemp("torch_ops") / "stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, TORCH_OPS, "loop"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
        )
    try:
        ops = TorchOps(proc, stderr)
        assert ops.line() == "ready"
        yield ops
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


async def _ask(torch_ops: TorchOps, *command: str) -> str:
    """:meth:`TorchOps.ask` off the event loop, bounded (each run's own timeouts are 30 s)."""
    with anyio.fail_after(90):
        return await anyio.to_thread.run_sync(torch_ops.ask, *command, abandon_on_cancel=True)


def test_torch_client_on_torchs_server_gives_the_expected_results(torch_ops: TorchOps) -> None:
    """The reference: torch's client on torch's own server (no event loop of ours)."""
    assert torch_ops.results("master") == EXPECTED


@on_every_backend
async def test_torch_client_same_results_on_our_server(
    store_server: StoreServer, torch_ops: TorchOps
) -> None:
    answer = await _ask(torch_ops, "client", store_server.host, str(store_server.port))
    assert json.loads(answer) == EXPECTED
    # what the torch client wrote is visible in-process (same "/" key convention)
    assert await store_server.local_store.get("ap") == b"xy"


@on_every_backend
async def test_our_client_same_results_on_both_servers(
    store_server: StoreServer, torch_ops: TorchOps
) -> None:
    # a fresh torch server for each backend: the run needs an empty store
    answer = await _ask(torch_ops, "serve")
    assert answer.startswith("port "), answer
    port = int(answer.split()[1])
    async with TCPStoreClient("127.0.0.1", port, timeout=30) as theirs:
        assert await run_our_ops(theirs) == EXPECTED
        # blocking get on torch's server, woken by another task's set
        async with anyio.create_task_group() as tg:
            got: list[bytes] = []

            async def getter() -> None:
                got.append(await theirs.get("late", timeout=10))

            tg.start_soon(getter)
            await anyio.wait_all_tasks_blocked()
            await theirs.set("late", "v")
        assert got == [b"v"]
        # a timed-out wait leaves the client usable
        with pytest.raises(StoreTimeoutError):
            await theirs.queue_pop("emptyq", timeout=0.1)
        await theirs.queue_push("emptyq", "x")
        assert await theirs.queue_pop("emptyq", timeout=5) == b"x"
    async with TCPStoreClient(store_server.host, store_server.port, timeout=30) as ours:
        assert await run_our_ops(ours) == EXPECTED


WORKER = r"""
import os, sys, datetime
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
dist.barrier()
# torch's server-side BARRIER (opcode 18) through a plain client
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=datetime.timedelta(seconds=60))
store.barrier("worker-barrier", 2)
print("result", dist.get_rank(), t.item(), flush=True)
dist.destroy_process_group()
"""


async def test_two_gloo_workers_all_reduce(store_server: StoreServer) -> None:
    outputs: dict[int, str] = {}

    async def worker(rank: int) -> None:
        env = {
            **os.environ,
            "MASTER_ADDR": store_server.host,
            "MASTER_PORT": str(store_server.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",  # gloo pairs on loopback only
        }
        proc = await anyio.run_process([sys.executable, "-c", WORKER], env=env, check=False)
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        outputs[rank] = proc.stdout.decode()

    with anyio.fail_after(80):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker, 0)
            tg.start_soon(worker, 1)
    assert "result 0 3.0" in outputs[0]
    assert "result 1 3.0" in outputs[1]


async def _capture_handshake(connect: Any) -> tuple[bytes, bytes]:
    """Listen on a raw socket, run ``connect(port)``, return (first 5 bytes, next 5 bytes)."""
    first: list[bytes] = []
    got = anyio.Event()

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            with anyio.fail_after(30):
                while len(data) < 10:
                    data += await stream.receive()
            first.append(data)
            await stream.send(data[6:10])  # echo the PING nonce
            got.set()
            with anyio.move_on_after(10), contextlib.suppress(anyio.EndOfStream, OSError):
                await stream.receive()  # until the client hangs up

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        await connect(port)
        with anyio.fail_after(30):
            await got.wait()
        tg.cancel_scope.cancel()
    return first[0][:5], first[0][5:10]


async def test_client_protocol_bytes_match_torch(torch_ops: TorchOps) -> None:
    """Mirror torch's TestClientProtocol: VALIDATE + magic, then PING with the pid."""

    async def torch_connect(port: int) -> None:
        await _ask(torch_ops, "connect", str(port))

    validate, ping = await _capture_handshake(torch_connect)
    assert validate == bytes.fromhex("00cef7853c")
    assert ping[0] == 13
    assert int.from_bytes(ping[1:], "little") == torch_ops.proc.pid

    async def our_connect(port: int) -> None:
        client = TCPStoreClient("127.0.0.1", port, timeout=5, connect_timeout=5)
        await client.connect()
        await client.aclose()

    validate, ping = await _capture_handshake(our_connect)
    assert validate == bytes.fromhex("00cef7853c")
    assert ping == b"\x0d" + os.getpid().to_bytes(4, "little")


async def test_server_shutdown_releases_blocked_torch_client(torch_ops: TorchOps) -> None:
    answers: list[str] = []
    async with StoreServer() as server, anyio.create_task_group() as tg:

        async def blocked_get() -> None:
            answers.append(await _ask(torch_ops, "blocked_get", str(server.port)))

        tg.start_soon(blocked_get)
        with anyio.fail_after(60):
            await server.local_store.get("connected")
            await server.aclose()
    assert len(answers) == 1 and answers[0].startswith("raised "), answers
