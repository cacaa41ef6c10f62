"""examples/train_ddp.py under ``aelastic run``: real DDP (gloo, CPU) with checkpoint/resume.

A run that crashes at a step on its first attempt and is restarted by the agent must
end with exactly the parameters of a run that never crashed.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ._nodes import EXAMPLE, cluster

STEPS = ["--steps", "12", "--checkpoint-every", "4"]


async def _run(argv: list[str]) -> tuple[int, list[str], str]:
    async with cluster() as c:
        node = await c.start(argv)
        with anyio.fail_after(100):
            code = await node.wait()
    return code, node.lines, node.err


def _checksum(lines: list[str]) -> str:
    finals = [line for line in lines if line.startswith("FINAL")]
    assert len(finals) == 1, lines
    return finals[0].split("checksum=")[1].strip()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Checksum of a 2-worker standalone run that never crashes."""
    ckpt = tmp_path_factory.mktemp("plain") / "ckpt.bin"
    argv = ["--standalone", "--nproc-per-node", "2", EXAMPLE, *STEPS, "--checkpoint", str(ckpt)]
    code, lines, err = anyio.run(_run, argv)
    assert code == 0, err
    assert any("attempt=0 world_size=2 resuming_from_step=0" in line for line in lines)
    return _checksum(lines)


def test_standalone_ddp_with_two_gloo_workers(uninterrupted: str) -> None:
    assert len(uninterrupted) == 16


async def test_crash_and_resume_ends_with_the_same_parameters(
    uninterrupted: str, tmp_path: Path
) -> None:
    argv = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", EXAMPLE, *STEPS]
    argv += ["--checkpoint", str(tmp_path / "ckpt.bin"), "--crash-at-step", "6"]
    code, lines, err = await _run(argv)
    assert code == 0, err
    assert any("crashing on purpose at step 6" in line for line in lines)
    assert any("attempt=1 world_size=2 resuming_from_step=4" in line for line in lines), lines
    assert _checksum(lines) == uninterrupted
