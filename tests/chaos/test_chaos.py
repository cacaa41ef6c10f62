"""The chaos suite: every fault kind once, seeded, on a real 3-node gloo job (see _harness).

``AELASTIC_CHAOS_SEED`` replays another seed; ``benchmarks/chaos.py`` runs more trials and
torchrun alongside.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ._harness import FAULTS, HOST_FAULTS, Fault, run_trial
from ._netns import two_hosts, unavailable

SEED = int(os.environ.get("AELASTIC_CHAOS_SEED", "20261123"))

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name.replace(" ", "-"))
async def test_chaos_trial(fault: Fault, tmp_path: Path) -> None:
    result = await run_trial(fault, SEED + FAULTS.index(fault), tmp_path)
    assert not result.problems(), "\n".join([result.outcome, *result.problems()])


async def test_network_partition(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no second test host: {reason}")
    fault = HOST_FAULTS[0]
    with two_hosts() as hosts:
        result = await run_trial(fault, SEED, tmp_path, hosts=hosts)
    assert not result.problems(), "\n".join([result.outcome, *result.problems()])
