"""Group ranks of real agents: ``--node-rank-order`` (``env:VAR``, ``hostname``) and ranks
kept across a restart.

Three ``aelastic run`` processes on loopback (c10d, the first hosts the store; for
``hostname`` each runs in a UTS namespace of its own, so it has its own host name); each
worker is a shell line that records its node's tag, GROUP_RANK and RANK.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from aelastic import LaunchConfig
from aelastic.launcher._args import UsageError, parse_run_args
from aelastic.launcher._build import make_handler
from aelastic.launcher._exceptions import LaunchConfigError

from ._nodes import AELASTIC_RUN, cluster, free_port, wait_all
from .test_multinode import FAST

#: ``sh -c`` script: $0 tag, $1 out dir. Writes "tag group_rank rank restart" to a file
#: of its own (not named with ``$$``: the launcher turns ``$$`` into ``$``, like torch).
#: With $2 = crash, the worker of group rank 2 fails its first attempt once the three
#: first workers are up; every other worker ends once six are recorded (three per attempt).
_WORKER = (
    't=$(mktemp); echo "$0 $GROUP_RANK $RANK $TORCHELASTIC_RESTART_COUNT" > "$t"; mv "$t" "$1/"; '
    'if [ "$2" = crash ] && [ "$GROUP_RANK" = 2 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
    'until [ "$(ls "$1" | wc -l)" -ge 3 ]; do sleep 0.02; done; exit 1; fi; '
    'if [ "$2" = crash ]; then until [ "$(ls "$1" | wc -l)" -ge 6 ]; do sleep 0.02; done; fi'
)


def _argv(port: int, run_id: str, tag: str, out: Path, *flags: str, mode: str = "") -> list[str]:
    return [
        "--nnodes", "3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--max-restarts", "1",
        "--rdzv-conf", f"{FAST},is_host={int(tag == 'host')}", "--local-addr", "127.0.0.1",
        *flags, "--no-python", "sh", "-c", _WORKER, tag, str(out), mode,
    ]  # fmt: skip


def _rows(out: Path) -> list[list[str]]:
    return sorted(p.read_text().split() for p in out.iterdir())


def _uts_unavailable() -> str | None:
    """Why agents cannot get host names of their own here (a UTS namespace each)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return "needs root and util-linux's unshare"
    done = subprocess.run(["unshare", "-u", "hostname", "probe"], capture_output=True, check=False)
    return None if done.returncode == 0 else f"unshare -u failed: {done.stderr!r}"


_NO_UTS = _uts_unavailable()


def _on_host(name: str) -> list[str]:
    """``aelastic run`` in a UTS namespace of its own, named ``name`` (same loopback)."""
    return ["unshare", "-u", "sh", "-c", f'hostname {name} && exec "$@"', "sh", *AELASTIC_RUN]


@pytest.mark.parametrize(
    "key",
    [
        "env:RACK",
        pytest.param(
            "hostname", marks=pytest.mark.skipif(_NO_UTS is not None, reason=str(_NO_UTS))
        ),
    ],
)
async def test_key_orders_group_ranks_behind_the_store_host(tmp_path: Path, key: str) -> None:
    port, flags = free_port(), ["--node-rank-order", key]
    async with cluster() as c:
        # started in this order, so join order (the old rule) would rank n1 before n2
        nodes = []
        for tag, label in (("host", "sw2"), ("n1", "sw3"), ("n2", "sw1")):
            argv = _argv(port, "keyed", tag, tmp_path, *flags)
            if key == "hostname":
                nodes.append(await c.start(argv, launcher=_on_host(f"{label}-node")))
            else:
                nodes.append(await c.start(argv, env={"RACK": label}))
        codes = await wait_all(nodes, 60)
    assert codes == [0, 0, 0], [n.err for n in c.nodes]
    # the store's host keeps group rank 0; then sw1, then sw3
    assert _rows(tmp_path) == [
        ["host", "0", "0", "0"],
        ["n1", "2", "2", "0"],
        ["n2", "1", "1", "0"],
    ]


async def test_group_ranks_survive_a_worker_crash_restart(tmp_path: Path) -> None:
    port = free_port()
    async with cluster() as c:
        nodes = [await c.start(_argv(port, "sticky", tag, tmp_path, mode="crash")) for tag in
                 ("host", "n1", "n2")]  # fmt: skip
        codes = await wait_all(nodes, 60)
    assert codes == [0, 0, 0], [n.err for n in c.nodes]
    rows = _rows(tmp_path)
    assert len(rows) == 6, rows
    # the crashed node (group rank 2) rejoins first after its failure: join order would
    # have made it group rank 1; every node keeps its group and global rank instead
    by_tag = {tag: {(group, rank) for t, group, rank, _ in rows if t == tag} for tag, *_ in rows}
    assert all(len(seen) == 1 for seen in by_tag.values()), rows
    assert sorted(next(iter(seen)) for seen in by_tag.values()) == [
        ("0", "0"), ("1", "1"), ("2", "2")
    ]  # fmt: skip
    assert sorted(restart for *_, restart in rows).count("1") >= 1, rows


def test_bad_rank_order_input_gets_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    dynamic = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "x.py"]
    with pytest.raises(UsageError, match="--node-rank-order 'rack': unknown key; pass 'hostname'"):
        parse_run_args(["--node-rank-order", "rack", *dynamic], {})
    config = parse_run_args(dynamic, {"PET_NODE_RANK_ORDER": "env:RACK"}).config
    assert config.node_rank_order == "env:RACK"
    monkeypatch.delenv("RACK", raising=False)
    with pytest.raises(LaunchConfigError, match="RACK is unset or empty on this node; set RACK"):
        make_handler(config, "job")
    with pytest.raises(UsageError, match=r"applies to the dynamic rendezvous .* --node-rank"):
        parse_run_args(["--nnodes", "2", "--node-rank-order", "hostname", "x.py"], {})
    with pytest.raises(
        LaunchConfigError, match=r"LaunchConfig\.node_rank_order 'env:': unknown key"
    ):
        LaunchConfig(1, 1, 1, rdzv_backend="c10d", node_rank_order="env:")
    assert os.environ.get("RACK") is None
