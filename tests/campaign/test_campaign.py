"""CI's quick subset of the fault campaign (issue 36): hand-picked schedules, no violation.

Each schedule is a real job (``aelastic run`` agents on loopback training
``campaign_worker.py`` with every-step checkpoints) with several faults; ``_campaign``
checks the invariants. Together they cover a scale-up (``grow``: a node joins), two
scale-downs and a crash (``shrink``: a graceful leave, a worker crash, the store's host
SIGKILLed), and a straggler found, excluded and replaced by a spare (``straggler``).
``benchmarks/campaign.py`` runs generated ones (``--seed N`` replays one, ``--schedule
NAME`` one of these).

A violation listed in :data:`KNOWN` (a defect found by the campaign and reported, not yet
fixed) makes its test xfail, naming it; any other violation fails the test with the
report: the seed, the command that replays it, the agents' stderr tails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._campaign import NAMED, Result, Schedule, run_schedule

#: A schedule takes 15-50 s on an idle 2-core machine; the bound is for a loaded one.
pytestmark = pytest.mark.timeout(300)

#: Defects the campaign found and reported, not fixed yet, by a pattern of the violation's
#: text -> what it is. (Found and since fixed: the missing aelastic.goodput event of an
#: agent ending on SIGTERM or excluded, and its ledger's "steps unknown", 0dbb2d0.)
KNOWN: dict[str, str] = {}


def check(result: Result) -> None:
    """Fail on a violation not in :data:`KNOWN`; xfail naming the known ones."""
    unknown = [v for v in result.violations if not any(re.search(k, v.text) for k in KNOWN)]
    assert not unknown, result.report()
    known = sorted(
        {why for v in result.violations for k, why in KNOWN.items() if re.search(k, v.text)}
    )
    if known:
        pytest.xfail("known defect(s): " + "; ".join(known))


async def _run(schedule: Schedule, tmp_path: Path) -> Result:
    result = await run_schedule(schedule, tmp_path)
    assert [e.kind for e in result.fired] == [e.kind for e in schedule.events], result.report()
    return result


async def test_a_node_joins(tmp_path: Path) -> None:
    result = await _run(NAMED["grow"], tmp_path)
    check(result)


async def test_nodes_leave_and_the_store_host_is_lost(tmp_path: Path) -> None:
    result = await _run(NAMED["shrink"], tmp_path)
    check(result)


async def test_a_straggler_is_excluded_and_a_spare_takes_its_place(tmp_path: Path) -> None:
    result = await _run(NAMED["straggler"], tmp_path)
    # the slow node was found and taken out (not merely outlasted by the job's end)
    assert result.codes["n1"] == 95, result.report()
    check(result)
