"""The node-list parser against Slurm's own ``scontrol show hostnames``."""

from __future__ import annotations

import random

import pytest

from aelastic._exceptions import ConfigError
from aelastic.schedulers._nodelist import expand_nodelist

from ._slurm_cluster import SlurmCluster


def _number(rng: random.Random) -> str:
    value = rng.choice([0, 1, 7, 9, 10, 99, 100, rng.randrange(1000)])
    return str(value).zfill(rng.choice([0, 0, 2, 3, 4]))


def _group(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        low = _number(rng)
        if rng.random() < 0.6:
            high = str(int(low) + rng.randrange(12))
            parts.append(f"{low}-{high.zfill(rng.choice([0, len(low)]))}")
        else:
            parts.append(low)
    return "[" + ",".join(parts) + "]"


def _item(rng: random.Random) -> str:
    prefix = rng.choice(["n", "gpu-", "node", "r", "a1b", "x_", "c.0"])
    if rng.random() < 0.15:
        return prefix + str(rng.randrange(50))
    item = prefix + _group(rng)
    if rng.random() < 0.3:
        item += rng.choice(["n", "-", "s"]) + _group(rng)
    return item


def generated_lists(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [",".join(_item(rng) for _ in range(rng.randint(1, 4))) for _ in range(count)]


def _scontrol_hostnames(slurm: SlurmCluster, nodelist: str) -> list[str]:
    """Slurm's own expansion (a few milliseconds a call: no daemon is asked)."""
    return slurm.run("scontrol", "show", "hostnames", nodelist).stdout.split()


def test_agrees_with_scontrol_on_generated_lists(slurm: SlurmCluster) -> None:
    lists = ["n[1-3,5],gpu-[01-02]", "n[001-3]", "a[8-011]", "r[1-2]n[01-02]", "a,,b"]
    lists += generated_lists(400, seed=38)
    expected = [_scontrol_hostnames(slurm, nodelist) for nodelist in lists]
    mismatches = [
        (nodelist, want, expand_nodelist(nodelist))
        for nodelist, want in zip(lists, expected, strict=True)
        if expand_nodelist(nodelist) != want
    ]
    assert not mismatches, mismatches[:5]
    assert sum(len(hosts) for hosts in expected) > 2000  # the lists were not trivial


@pytest.mark.parametrize(
    ("nodelist", "fault"),
    [
        ("", "empty"),
        ("n[3-1]", "backwards"),
        ("n[1-2", "never closed"),
        ("n1]", "without '['"),
        ("n[1-2]x", "after its last bracket"),
        ("n[]", "not a number"),
        ("n[1-2,]", "not a number"),
        ("n[a]", "not a number"),
        ("a[1]b[2]c[3]", "3 bracket groups"),
        ("n[[1]]", "nested"),
        ("n 1", "white space"),
        ("n[0-99999999]", "more than"),
    ],
)
def test_bad_lists_get_one_clear_error(nodelist: str, fault: str) -> None:
    with pytest.raises(ConfigError, match="cannot expand the Slurm node list") as caught:
        expand_nodelist(nodelist)
    assert fault in str(caught.value)
