"""The chaos suite: every fault kind once, seeded, on a real 3-node gloo job (see _harness).

``AELASTIC_CHAOS_SEED`` replays another seed; ``benchmarks/chaos.py`` runs more trials and
torchrun alongside.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ._harness import FAULTS, Fault, run_trial

SEED = int(os.environ.get("AELASTIC_CHAOS_SEED", "20261123"))

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name.replace(" ", "-"))
async def test_chaos_trial(fault: Fault, tmp_path: Path) -> None:
    result = await run_trial(fault, SEED + FAULTS.index(fault), tmp_path)
    assert not result.problems(), "\n".join([result.outcome, *result.problems()])
