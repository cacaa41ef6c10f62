"""``aelastic run`` with checkpoints: /status reports the memory held; SIGTERM writes to disk."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import anyio
import anyio.to_thread
from launcher._nodes import cluster, free_port  # tests/ is on sys.path

SCRIPT = str(Path(__file__).parent / "scripts" / "ckpt_ddp.py")


def _status(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as response:
        body: dict[str, object] = json.loads(response.read())
    return body


async def test_sigterm_writes_the_newest_step_and_frees_the_memory(tmp_path: Path) -> None:
    disk, port = tmp_path / "ckpt", free_port()
    async with cluster() as c:
        node = await c.start(
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                "--health-port",
                str(port),
                "--checkpoint-dir",
                str(disk),
                SCRIPT,
                "--out",
                str(tmp_path / "out.jsonl"),
                "--steps",
                "1000000000",
                "--print-saves",
            ]
        )
        with anyio.fail_after(60):
            await node.wait_for_line(lambda line: line.startswith("SAVED 4"))
            memory_dir = next(line.split()[1] for line in node.lines if line.startswith("DIR "))
            status = await anyio.to_thread.run_sync(_status, port)
            held = status["checkpoint"]
            assert isinstance(held, dict) and held["memory_dir"] == memory_dir
            assert held["bytes_held"] > 0 and held["persist_dir"] == str(disk)
            assert held["resumed_step"] is None
            node.process.send_signal(signal.SIGTERM)
            assert await node.wait() == 96, node.err  # preempted, the step is on disk
    saved = max(int(line.split()[1]) for line in node.lines if line.startswith("SAVED"))
    manifest = json.loads((disk / "manifest.json").read_text())
    # the newest step both ranks completed: the one rank 0 reported last, or one after
    assert manifest["step"] in (saved, saved + 2), (manifest, saved)
    assert all((disk / name).stat().st_size > 0 for name in manifest["files"].values())
    assert not await anyio.Path(memory_dir).exists()
