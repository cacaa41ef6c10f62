"""``Tick.lead``: the store's host gets rank 0, the others keep join order."""

from __future__ import annotations

import pytest

from aelastic.rendezvous import RendezvousStateError
from aelastic.rendezvous._state import Tick

KEY = "rdzv/x/c/0/tick"


def test_lead_takes_rank_0_and_the_rest_keep_join_order() -> None:
    tick = Tick(4, "running", upto=5, world=4, removed=(2,), lead=3)
    assert Tick.loads(KEY, tick.dumps().encode()) == tick
    assert [tick.rank_of(t) for t in (0, 1, 3, 4)] == [1, 2, 0, 3]
    assert sorted(tick.rank_of(t) for t in (0, 1, 3, 4)) == list(range(tick.world))
    assert '"lead"' not in Tick(1, "running", upto=2, world=2).dumps()  # old readers


def test_a_lead_that_is_no_member_is_a_state_error() -> None:
    bad = Tick(4, "running", upto=5, world=4, removed=(2,), lead=2)
    with pytest.raises(RendezvousStateError, match="lead 2 is not a member"):
        Tick.loads(KEY, bad.dumps().encode())
