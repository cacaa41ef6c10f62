"""A node is lost and replaced: its rank resumes from the peer copy (``--checkpoint-peer-copies``).

Two test hosts are network namespaces (``tests/chaos/_netns.py``): the agents talk over
a veth link, not loopback. A network namespace does not separate ``/dev/shm``, so each
agent also gets its own memory root (``AELASTIC_CHECKPOINT_MEMORY_ROOT``), and the
replacement agent a new, empty one: like a new machine, it cannot read what the killed
agent held, and the only copy of its rank's state is the one on the other node. That
simulates separate machines honestly enough for what is tested here (the copy crosses
the network between two agents; nothing is read from the dead node's memory).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import anyio
import pytest
from chaos._netns import two_hosts, unavailable  # tests/ is on sys.path
from launcher._nodes import cluster, free_port, wait_all

from .test_checkpoint_ddp import SCRIPT

pytestmark = pytest.mark.timeout(150)

CONF = "keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=60,close_timeout=5"


async def test_a_replacement_node_resumes_its_rank_from_the_peer_copy(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no second test host: {reason}")
    # a run on one node, same world, without faults (conftest; shared with the DDP tests)
    uninterrupted = request.getfixturevalue("uninterrupted")

    out = tmp_path / "out.jsonl"
    roots = {name: tmp_path / f"shm_{name}" for name in ("a", "b", "new_b")}
    with two_hosts() as hosts:
        endpoint = f"{hosts.addresses[0]}:{free_port()}"

        def argv(host: int, is_host: bool) -> list[str]:
            return [
                "--nnodes", "2",
                "--nproc-per-node", "1",
                "--max-restarts", "2",
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint,
                "--rdzv-id", "peer",
                "--rdzv-conf", f"{CONF},is_host={int(is_host)}",
                "--local-addr", hosts.addresses[host],
                "--monitor-interval", "0.1",
                "--checkpoint-peer-copies", "1",
                SCRIPT, "--out", str(out), "--steps", "12", "--every", "2",
                "--hold-after-save", "6", "--own-only",
            ]  # fmt: skip

        def env(host: int, root: Path) -> dict[str, str]:
            return {
                "GLOO_SOCKET_IFNAME": hosts.interfaces[host],
                "AELASTIC_CHECKPOINT_MEMORY_ROOT": str(root),
                "LOGLEVEL": "DEBUG",
            }

        run = [sys.executable, "-m", "aelastic", "run"]
        async with cluster() as c:
            a = await c.start(argv(0, True), env(0, roots["a"]), launcher=[*hosts.prefix(0), *run])
            b = await c.start(argv(1, False), env(1, roots["b"]), launcher=[*hosts.prefix(1), *run])
            with anyio.fail_after(90):
                for node in (a, b):
                    await node.wait_for_line(lambda line: line.startswith("HELD 6 "))
                # b's step 6 reached a's agent (whatever group rank each node got)
                await b.wait_for_err("checkpoint step 6 copied to node")
            b.process.send_signal(signal.SIGKILL)
            await b.wait()
            new_b = await c.start(
                argv(1, False), env(1, roots["new_b"]), launcher=[*hosts.prefix(1), *run]
            )
            codes = await wait_all([a, new_b], 90)
        assert codes == [0, 0], "\n".join(n.err[-4000:] for n in (a, new_b))

    assert "checkpoint step 6 of ranks" in new_b.err and "fetched from node" in new_b.err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records == [{"start": 6, "attempt": records[0]["attempt"], "checksum": uninterrupted}]


async def test_a_job_that_shrinks_reads_rank_0_on_every_rank(tmp_path: Path) -> None:
    """Three nodes on loopback (a memory root each), two copies of every node's step: one
    node's agent is SIGKILLed, the job goes on with two nodes, and each rank of the new
    world reads ``load(rank=0)`` of the step saved by the world of three."""
    out = tmp_path / "out.jsonl"
    endpoint = f"127.0.0.1:{free_port()}"
    # The three launchers start together, so the last call (after the second joins) only
    # has to cover the spread of their start-ups for round 0 to hold all three; the round
    # after the kill waits it out in full (its world stays below max).
    conf = f"{CONF},last_call_timeout=4"

    def argv(is_host: bool) -> list[str]:
        return [
            "--nnodes", "2:3",
            "--nproc-per-node", "1",
            "--max-restarts", "2",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint,
            "--rdzv-id", "shrink",
            "--rdzv-conf", f"{conf},is_host={int(is_host)}",
            "--monitor-interval", "0.1",
            "--checkpoint-peer-copies", "2",
            SCRIPT, "--out", str(out), "--steps", "10", "--every", "2",
            "--hold-after-save", "6", "--load-rank", "0",
        ]  # fmt: skip

    async with cluster() as c:
        nodes = [
            await c.start(
                argv(i == 0),
                {"AELASTIC_CHECKPOINT_MEMORY_ROOT": str(tmp_path / f"shm{i}"), "LOGLEVEL": "DEBUG"},
            )
            for i in range(3)
        ]
        with anyio.fail_after(90):
            for node in nodes:
                await node.wait_for_line(lambda line: line.startswith("HELD 6 "))
            ranks = [
                int(next(ln for ln in n.lines if ln.startswith("HELD 6 ")).split()[-1])
                for n in nodes
            ]
            for node, rank in zip(nodes, ranks, strict=True):  # one process per node
                for other in set(ranks) - {rank}:
                    await node.wait_for_err(f"checkpoint step 6 copied to node {other}\n")
        victim = nodes[2]  # not node 0: it hosts the rendezvous store
        victim.process.send_signal(signal.SIGKILL)
        await victim.wait()
        codes = await wait_all(nodes[:2], 90)
    assert codes == [0, 0], "\n".join(n.err[-4000:] for n in nodes[:2])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["start"] for r in records] == [6]
