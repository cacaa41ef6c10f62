"""Group rank 0 stays on the node that hosts the c10d store, on separate addresses.

Two hosts (network namespaces, see ``_netns``): the store's host is ``a``. Node ``b``'s
worker fails on its first attempt, so ``b`` is the first to rejoin after the failure
(``a`` only learns of it from the rendezvous). Round after round, ``a`` must be group
rank 0: the workers' store (MASTER_ADDR) then stays on the machine every node reaches.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from launcher._nodes import AELASTIC_RUN, cluster, wait_all

from ._netns import two_hosts, unavailable

_WHY = unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))

#: Records "tag group_rank master_addr restart_count". b's first attempt fails; a's
#: workers end once b's second attempt has started (a's first one is stopped before).
_WORKER = (
    'echo "$0 $GROUP_RANK $MASTER_ADDR $TORCHELASTIC_RESTART_COUNT" '
    '> "$1/$0.$TORCHELASTIC_RESTART_COUNT.$$"; '
    'if [ "$0" = b ]; then [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 1; exit 0; fi; '
    'until ls "$1" | grep -q "^b[.]1[.]"; do sleep 0.05; done'
)


async def test_group_rank_0_stays_on_the_store_host(tmp_path: Path) -> None:
    with two_hosts() as hosts:
        a, b = hosts.addresses

        def argv(addr: str, tag: str) -> list[str]:
            return [
                "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{a}:29631", "--rdzv-id", "placement", "--max-restarts", "1",
                "--rdzv-conf", f"join_timeout=60,close_timeout=5,is_host={int(tag == 'a')}",
                "--local-addr", addr, "--no-python", "sh", "-c", _WORKER, tag, str(tmp_path),
            ]  # fmt: skip

        async with cluster() as c:
            node_a = await c.start(argv(a, "a"), launcher=[*hosts.prefix(0), *AELASTIC_RUN])
            node_b = await c.start(argv(b, "b"), launcher=[*hosts.prefix(1), *AELASTIC_RUN])
            codes = await wait_all([node_a, node_b], 90)
        assert codes == [0, 0], [n.err for n in c.nodes]
    rows = sorted((tmp_path / name).read_text().split() for name in os.listdir(tmp_path))
    assert sorted(restarts for tag, _, _, restarts in rows if tag == "b") == ["0", "1"], rows
    assert {(tag, rank) for tag, rank, _, _ in rows} == {("a", "0"), ("b", "1")}, rows
    assert {master for _, _, master, _ in rows} == {a}
