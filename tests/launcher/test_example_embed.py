"""examples/embed_service.py runs as documented: one job finishes, the other is cancelled."""

from __future__ import annotations

import ast
import sys

import anyio

from ._jobs import alive as _alive
from ._nodes import HERE

EXAMPLE = str(HERE.parent.parent / "examples" / "embed_service.py")


async def test_embed_service_example() -> None:
    with anyio.fail_after(90):
        done = await anyio.run_process([sys.executable, EXAMPLE], check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    lines = out.splitlines()
    assert any(line.startswith("[long] HEALTHY, worker pids [") for line in lines), out
    short = [line for line in lines if line.startswith("[short] ")]
    assert short[0] == "[short] INIT (round None)"
    assert short[-1] == "[short] result {0: None, 1: None}"
    assert "[short] SUCCEEDED" in short[-2]
    cancelled = [line for line in lines if line.startswith("[long] cancelled: STOPPED")]
    assert len(cancelled) == 1, out
    pids = ast.literal_eval(cancelled[0].split("pids ", 1)[1])
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
