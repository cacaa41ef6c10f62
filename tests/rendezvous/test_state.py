"""Stored rendezvous records: any bytes parse or raise RendezvousStateError naming the key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aelastic.rendezvous import RendezvousStateError
from aelastic.rendezvous._state import Message, Tick, live_members, parse_int

KEY = "rdzv/run/c/3/tick"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_parse_or_raise_state_error(raw: bytes) -> None:
    for parse in (Tick.loads, Message.loads):
        try:
            parse(KEY, raw)
        except RendezvousStateError as exc:
            assert KEY in str(exc)
    try:
        parse_int(KEY, raw)
    except RendezvousStateError as exc:
        assert KEY in str(exc)


@pytest.mark.parametrize("bad", [[], ["running"], {}, {"a": 1}, 1.5, None])
def test_unhashable_or_odd_choice_fields_are_state_errors(bad: object) -> None:
    tick = {"n": 1, "state": bad, "upto": 1, "world": 1, "waiting": 0, "removed": []}
    with pytest.raises(RendezvousStateError, match=KEY):
        Tick.loads(KEY, json.dumps(tick).encode())
    with pytest.raises(RendezvousStateError, match=KEY):
        Message.loads(KEY, json.dumps({"op": bad, "ticket": 1}).encode())


@given(
    st.builds(
        Tick,
        n=st.integers(0, 10**6),
        state=st.sampled_from(["joining", "dissolved", "closed"]),
        upto=st.integers(0, 100),
        world=st.integers(0, 100),
        waiting=st.integers(0, 100),
        removed=st.lists(st.integers(0, 100), max_size=5).map(tuple),
    )
)
def test_tick_round_trips(tick: Tick) -> None:
    assert Tick.loads(KEY, tick.dumps().encode()) == tick


def test_running_tick_must_be_consistent() -> None:
    good = Tick(4, "running", upto=5, world=4, removed=(2,))
    assert Tick.loads(KEY, good.dumps().encode()) == good
    assert [good.rank_of(t) for t in (0, 1, 3, 4)] == [0, 1, 2, 3]
    assert not good.is_member(2) and not good.is_member(5)
    bad = Tick(4, "running", upto=5, world=5, removed=(2,))
    with pytest.raises(RendezvousStateError, match="does not match"):
        Tick.loads(KEY, bad.dumps().encode())


def test_live_members_in_join_order() -> None:
    assert live_members(6, {1, 3}, 3) == [0, 2, 4]
    assert live_members(3, set(), 5) == [0, 1, 2]
