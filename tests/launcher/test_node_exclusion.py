"""``--exclude-node-after``: a crash-looping node steps out and the others finish."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

from aelastic.nodes._exceptions import NODE_EXCLUDED_EXIT_CODE

from ._nodes import WORKER, cluster, free_port, records, wait_all
from .test_multinode import FAST, _c10d


async def _marked(port: int, kind: str) -> bool:
    """Whether a node of the ``exclude`` run shows a ``kind`` mark in ``aelastic status``."""
    done = await anyio.run_process(
        [sys.executable, "-m", "aelastic", "status", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "exclude", "--json"],
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return False
    nodes = json.loads(done.stdout)["nodes"]
    marks = [m for n in nodes for m in n["history"]["marks"]]
    return any(m[1] == kind for m in marks)


async def test_crash_looping_node_is_excluded_and_the_others_finish(tmp_path: Path) -> None:
    port = free_port()
    good, bad, marker = tmp_path / "good", tmp_path / "bad", tmp_path / "excluded"
    good.mkdir()
    bad.mkdir()
    # the budget (1 restart) would end the job at the bad node's 2nd failure: the
    # exclusion takes its place and spends nothing
    policy = ["--max-restarts", "1", "--exclude-node-after", "2"]
    policy += ["--exclude-node-cooldown", "600"]
    conf = FAST.replace("last_call_timeout=0.5", "last_call_timeout=1")

    def argv(is_host: int, out: Path, *tail: str) -> list[str]:
        return [*_c10d("2:3", port, "exclude", f"{conf},is_host={is_host}"), *policy,
                WORKER, str(out), *tail]  # fmt: skip

    finish = ["--finish-at-world", "2", "--when-file", str(marker)]
    async with cluster() as c:
        host = await c.start(argv(1, good, *finish), env={"AELASTIC_NODE_ID": "host"})
        other = await c.start(argv(0, good, *finish), env={"AELASTIC_NODE_ID": "other"})
        crashy = await c.start(argv(0, bad, "--exit-code", "1"), env={"AELASTIC_NODE_ID": "bad"})
        with anyio.fail_after(90):
            await crashy.wait_for_err("excluding this node")
        # the exclusion is marked on the job view's time axis (published within a second;
        # each read is a whole `aelastic status` process, which paces the loop)
        with anyio.fail_after(30):
            while not await _marked(port, "excluded"):
                pass
        marker.touch()
        codes = await wait_all([host, other, crashy], 60)
    assert codes == [0, 0, NODE_EXCLUDED_EXIT_CODE], [n.err for n in c.nodes]
    # exactly N failed rounds of the bad node, the first of which spent its one restart
    assert sorted(r["TORCHELASTIC_RESTART_COUNT"] for r in records(bad)) == ["0", "1"]
    finals = [r for r in records(good) if r["WORLD_SIZE"] == "2"]
    assert sorted(r["RANK"] for r in finals) == ["0", "1"]
    # the others' budget is untouched: the bad node's failures were membership changes
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in finals} == {"0"}
    assert "bad excluded for 600 s (exclusion #1): its workers failed 2 time(s)" in crashy.err
    assert "local_rank 0 exited 1" in crashy.err


async def test_excluded_node_is_replaced_by_a_spare_in_its_group_rank(tmp_path: Path) -> None:
    """The job ends at full size (3 of 3): the spare takes the excluded node's place and
    its group rank, the others keep theirs. The spare starts once the bad node's second
    (last) attempt is up, so the bad node never races it for a seat: it is out after
    that attempt fails, and the spare waits or joins the next round."""
    port = free_port()
    dirs = {name: tmp_path / name for name in ("host", "good", "bad", "spare")}
    for d in dirs.values():
        d.mkdir()
    marker = tmp_path / "done"
    policy = ["--max-restarts", "1", "--exclude-node-after", "2", "--exclude-node-cooldown", "600"]

    def argv(name: str, *tail: str) -> list[str]:
        conf = f"{FAST},is_host={int(name == 'host')}"
        return [*_c10d("3", port, "spare", conf), *policy, WORKER, str(dirs[name]), *tail]

    finish = ["--finish-at-world", "3", "--when-file", str(marker)]
    async with cluster() as c:
        host = await c.start(argv("host", *finish))
        good = await c.start(argv("good", *finish))
        bad = await c.start(argv("bad", "--exit-code", "1"))
        with anyio.fail_after(60):
            await bad.wait_for_line(lambda line: line.startswith("READY"), count=2)
        spare = await c.start(argv("spare", *finish))
        with anyio.fail_after(60):
            await spare.wait_for_line(lambda line: line.startswith("READY"))
        marker.touch()
        codes = await wait_all([host, good, bad, spare], 60)
    assert codes == [0, 0, NODE_EXCLUDED_EXIT_CODE, 0], [n.err for n in c.nodes]
    ranks = {name: {r["GROUP_RANK"] for r in records(d)} for name, d in dirs.items()}
    assert ranks["host"] == {"0"}, ranks
    assert len(ranks["good"]) == len(ranks["bad"]) == 1, ranks  # kept across restarts
    assert ranks["spare"] == ranks["bad"] and ranks["good"] | ranks["bad"] == {"1", "2"}, ranks
    assert {r["WORLD_SIZE"] for r in records(dirs["spare"])} == {"3"}
    assert sorted(r["TORCHELASTIC_RESTART_COUNT"] for r in records(dirs["bad"])) == ["0", "1"]
