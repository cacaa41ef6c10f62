"""examples/train_ddp.py under ``aelastic run``: real DDP (gloo, CPU) with checkpoint/resume.

A run that crashes at a step on its first attempt and is restarted by the agent must
end with exactly the parameters of a run that never crashed.
"""

from __future__ import annotations

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


Run = tuple[int, list[str], str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Both 2-worker standalone runs, at the same time (independent jobs, each with its own
    checkpoint): ``plain`` never crashes, ``crash`` crashes at step 6 on its first attempt."""
    plain = ["--standalone", "--nproc-per-node", "2", EXAMPLE, *STEPS]
    plain += ["--checkpoint", str(tmp_path_factory.mktemp("plain") / "ckpt.bin")]
    crash = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", EXAMPLE, *STEPS]
    crash += ["--checkpoint", str(tmp_path_factory.mktemp("crash") / "ckpt.bin")]
    crash += ["--crash-at-step", "6"]
    out: dict[str, Run] = {}

    async def both() -> None:
        async def one(name: str, argv: list[str]) -> None:
            out[name] = await _run(argv)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "plain", plain)
            tg.start_soon(one, "crash", crash)

    anyio.run(both)
    return out


@pytest.fixture(scope="module")
def uninterrupted(runs: dict[str, Run]) -> str:
    """Checksum of a 2-worker standalone run that never crashes."""
    code, lines, err = runs["plain"]
    assert code == 0, err
    assert any("attempt=0 world_size=2 resuming_from_step=0" in line for line in lines)
    return _checksum(lines)


def test_standalone_ddp_with_two_gloo_workers(uninterrupted: str) -> None:
    assert len(uninterrupted) == 16


def test_crash_and_resume_ends_with_the_same_parameters(
    uninterrupted: str, runs: dict[str, Run]
) -> None:
    code, lines, err = runs["crash"]
    assert code == 0, err
    assert any("crashing on purpose at step 6" in line for line in lines)
    assert any("attempt=1 world_size=2 resuming_from_step=4" in line for line in lines), lines
    assert _checksum(lines) == uninterrupted
