"""Three ``python -m aelastic run --rdzv-backend etcd`` nodes against a real etcd."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio

WORKER = """
import os
print("worker", os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["GROUP_RANK"],
      os.environ["MASTER_ADDR"], flush=True)
"""


async def test_three_nodes_run_to_completion(
    etcd_endpoint: str, run_id: str, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [
        sys.executable, "-m", "aelastic", "run",
        "--nnodes", "3", "--nproc-per-node", "1",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_endpoint, "--rdzv-id", run_id,
        "--rdzv-conf", "join_timeout=60,last_call_timeout=1",
        str(script),
    ]  # fmt: skip
    results: list[subprocess.CompletedProcess[bytes]] = []

    async def node() -> None:
        results.append(await anyio.run_process(cmd, check=False))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(node)
    for r in results:
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    lines = sorted(
        line for r in results for line in r.stdout.decode().splitlines() if "worker" in line
    )
    assert [line.split()[1:4] for line in lines] == [
        ["0", "3", "0"],
        ["1", "3", "1"],
        ["2", "3", "2"],
    ]
    assert all(line.split()[4] == "127.0.0.1" for line in lines)  # loopback etcd -> loopback store
