"""The root-cause decision among hung workers (aelastic.agent._blame), as a plain function."""

from __future__ import annotations

import pytest

from aelastic.agent._blame import Suspect, blame_order, in_collective

FAULTHANDLER_IN_ALL_REDUCE = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
  File "/v/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/job/train.py", line 30 in <module>
"""
FAULTHANDLER_IN_BACKWARD = """\
Current thread 0x00007f0000000001 (most recent call first):
  File "/v/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/v/site-packages/torch/autograd/__init__.py", line 347 in backward
  File "/v/site-packages/torch/_tensor.py", line 648 in backward
  File "/job/train.py", line 41 in <module>
"""
FAULTHANDLER_IN_USER_CODE = """\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/job/train.py", line 28 in <module>
"""
PY_SPY_IN_BARRIER = """\
Process 4242: python -u train.py
Thread 4242 (idle): "MainThread"
    barrier (torch/distributed/distributed_c10d.py:4801)
    wrapper (torch/distributed/c10d_logger.py:81)
    <module> (train.py:30)
"""
# A job's own module named like torch's, outside the torch package: not a collective.
LOOKALIKE = '  File "/job/mytorch/distributed/x.py", line 1 in f\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (FAULTHANDLER_IN_ALL_REDUCE, True),
        (FAULTHANDLER_IN_BACKWARD, True),
        (PY_SPY_IN_BARRIER, True),
        (FAULTHANDLER_IN_USER_CODE, False),
        (LOOKALIKE, False),
        ("", None),
        ("  \n", None),
        (None, None),
    ],
)
def test_in_collective_reads_faulthandler_and_py_spy_stacks(
    text: str | None, expected: bool | None
) -> None:
    assert in_collective(text) is expected


def test_at_the_same_step_the_rank_outside_the_collective_is_the_root_cause() -> None:
    # rank 1 stopped before its all-reduce with the newer heartbeat; rank 0 waits in it
    blocked = Suspect(0, step=3, last_progress_ns=100, collective=True)
    stopped = Suspect(1, step=3, last_progress_ns=200, collective=False)
    assert blame_order([blocked, stopped]) == [1, 0]
    assert blame_order([stopped, blocked]) == [1, 0]


def test_the_lowest_step_comes_before_the_collective() -> None:
    behind = Suspect(0, step=2, last_progress_ns=300, collective=True)
    ahead = Suspect(1, step=3, last_progress_ns=100, collective=False)
    assert blame_order([ahead, behind]) == [0, 1]


def test_unknown_stacks_rank_between_outside_and_inside_a_collective() -> None:
    unknown = Suspect(1, step=3, last_progress_ns=200, collective=None)
    blocked = Suspect(0, step=3, last_progress_ns=100, collective=True)
    assert blame_order([blocked, unknown]) == [1, 0]
    # the blocked rank's dump did not finish (unknown) and it has the older progress:
    # the rank known to be outside the collective is still the root cause
    late_dump = Suspect(0, step=3, last_progress_ns=100, collective=None)
    stopped = Suspect(1, step=3, last_progress_ns=200, collective=False)
    assert blame_order([late_dump, stopped]) == [1, 0]


@pytest.mark.parametrize("collective", [True, False, None])
def test_a_tie_on_the_stacks_falls_back_to_the_oldest_progress_then_the_rank(
    collective: bool | None,
) -> None:
    older = Suspect(1, step=3, last_progress_ns=100, collective=collective)
    newer = Suspect(0, step=3, last_progress_ns=200, collective=collective)
    assert blame_order([newer, older]) == [1, 0]
    same = Suspect(2, step=3, last_progress_ns=100, collective=collective)
    assert blame_order([same, older]) == [1, 2]
