"""What ``aelastic run`` reports when workers fail: every local failure, error files.

Real launcher processes and real workers (``failing_worker.py``); torchrun itself
where the test compares with it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ._nodes import HERE, cluster
from ._summary import summary_block, summary_entries

FAILING = str(HERE / "failing_worker.py")


def _warm_env(warm: bool) -> dict[str, str]:
    return {} if warm else {"AELASTIC_WARM_WORKERS": "0"}


@pytest.mark.parametrize(
    ("record", "warm"),
    [("aelastic", True), ("aelastic", False), ("torch", True)],
    ids=["aelastic-record-warm", "aelastic-record-fresh", "torch-record-warm"],
)
async def test_every_worker_that_fails_on_its_own_is_in_the_summary(
    tmp_path: Path, record: str, warm: bool
) -> None:
    if record == "torch":
        pytest.importorskip("torch")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    logs = tmp_path / "logs"
    argv = ["--standalone", "--nproc-per-node", "2", "--log-dir", str(logs)]
    async with cluster() as c:
        node = await c.start(
            [*argv, FAILING, record, "--barrier", str(barrier)], env=_warm_env(warm)
        )
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    _assert_each_has_its_own_error_file(node.err)


def _assert_each_has_its_own_error_file(stderr: str) -> None:
    block = summary_block(stderr)
    assert "<NO_OTHER_FAILURES>" not in block
    entries = summary_entries(stderr)
    assert sorted(e.local_rank for e in entries) == [0, 1], block
    assert [e.root for e in entries].count(True) == 1
    for entry in entries:
        # Each failure carries its own error file and its own traceback.
        assert Path(entry.error_file).is_file(), block
        assert Path(entry.error_file).parts[-2:] == (str(entry.local_rank), "error.json")
        assert f"RuntimeError: rank {entry.rank} fails on its own" in entry.traceback, block
        assert "Traceback (most recent call last)" in entry.traceback
    assert len({e.error_file for e in entries}) == 2


async def test_a_worker_the_agent_stopped_is_not_a_failure(tmp_path: Path) -> None:
    async with cluster() as c:
        node = await c.start(
            ["--standalone", "--nproc-per-node", "2", FAILING, "aelastic", "--only-rank", "1"]
        )
        with anyio.fail_after(100):
            assert await node.wait() == 1, node.err
    assert "<NO_OTHER_FAILURES>" in summary_block(node.err)
    (entry,) = summary_entries(node.err)
    assert (entry.root, entry.rank, entry.exitcode) == (True, 1, 1)
    assert "RuntimeError: rank 1 fails on its own" in entry.traceback
