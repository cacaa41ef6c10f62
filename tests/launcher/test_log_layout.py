"""Where worker output goes, side by side with torchrun on the same flags and worker script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from ._nodes import AELASTIC_RUN

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

#: Prints one tagged line to each stream; every line the launchers add lacks the tag.
WORKER = """
import os, sys
rank = os.environ["LOCAL_RANK"]
sys.stdout.write(f"TAGGED out {rank}\\n")
sys.stdout.flush()
sys.stderr.write(f"TAGGED err {rank}\\n")
sys.stderr.flush()
"""


async def run(launcher: Sequence[str], argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Run a launcher to completion; its tagged stdout and stderr lines, sorted."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    with anyio.fail_after(120):
        result = await anyio.run_process(
            [*launcher, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=False
        )
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 0, err

    def tagged(text: str) -> list[str]:
        return sorted(line for line in text.splitlines() if "TAGGED" in line)

    return tagged(result.stdout.decode(errors="replace")), tagged(err)


@pytest.mark.parametrize(
    "flags",
    [
        ["--redirects", "3"],
        ["--tee", "3", "--local-ranks-filter", "0"],
        ["--redirects", "1", "--tee", "2"],
    ],
)
async def test_devnull_log_dir_prints_like_torchrun(tmp_path: Path, flags: list[str]) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = ["--standalone", "--nproc-per-node", "2", "--log-dir", os.devnull, *flags, str(script)]
    ours = await run(AELASTIC_RUN, argv)
    theirs = await run(TORCHRUN, argv)
    assert ours == theirs
    # What torchrun does: everything, unprefixed, whatever the flags say.
    assert theirs == (["TAGGED out 0", "TAGGED out 1"], ["TAGGED err 0", "TAGGED err 1"])
