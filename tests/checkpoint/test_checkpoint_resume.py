"""The round's choice of a step and each node's fetches (``_resume``): plain functions.

Every expectation is written out by hand from the rule in docs/checkpoints.md
("Resizing"), not computed by the code under test.
"""

from __future__ import annotations

import json

import pytest

from aelastic.checkpoint._layout import source_rank
from aelastic.checkpoint._resume import Holdings, choose, fetch_plan, lost, missing, to_delete


def node(
    ranks: tuple[int, ...],
    memory: dict[int, dict[int, set[int]]] | None = None,
    disk: dict[int, dict[int, set[int]]] | None = None,
    *,
    serves: bool = True,
    metadata: tuple[int, ...] = (),
    disk_metadata: tuple[int, ...] = (),
) -> Holdings:
    def freeze(held: dict[int, dict[int, set[int]]] | None) -> dict[int, dict[int, frozenset[int]]]:
        return {s: {w: frozenset(r) for w, r in ws.items()} for s, ws in (held or {}).items()}

    return Holdings(
        ranks, freeze(memory), freeze(disk), frozenset(metadata), frozenset(disk_metadata), serves
    )


def test_source_rank_is_the_own_rank_when_the_saving_world_had_it_else_modulo() -> None:
    assert [source_rank(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [source_rank(r, 2) for r in range(2)] == [0, 1]


def test_a_job_that_grows_resumes_and_the_new_node_fetches_ranks_0_and_1() -> None:
    # world 4 (a: 0,1 and a copy of b's 2,3; b: 2,3 and a copy of a's 0,1) held steps 8
    # and 10; c joins with ranks 4,5 and nothing in memory
    a = node((0, 1), {8: {4: {0, 1, 2, 3}}, 10: {4: {0, 1, 2, 3}}})
    b = node((2, 3), {8: {4: {0, 1, 2, 3}}, 10: {4: {0, 1, 2, 3}}})
    c = node((4, 5))
    assert choose([a, b, c]) == (10, 4)
    assert fetch_plan([a, b, c], 2, 10, 4) == {0: frozenset({0, 1})}
    assert fetch_plan([a, b, c], 0, 10, 4) == {}
    assert lost([a, b, c], (10, 4)) is None


def test_a_node_that_cannot_fetch_vetoes_and_the_loss_is_named() -> None:
    # the same, but nobody serves peer copies (--checkpoint-peer-copies 0)
    a = node((0, 1), {10: {4: {0, 1}}}, serves=False)
    b = node((2, 3), {10: {4: {2, 3}}}, serves=False)
    c = node((4, 5), serves=False)
    assert choose([a, b, c]) is None
    assert lost([a, b, c], None) == 10


def test_a_shared_disk_lets_every_node_read_its_sources_without_fetching() -> None:
    disk = {10: {4: {0, 1, 2, 3}}}
    nodes = [node((0, 1), disk=disk), node((2, 3), disk=disk), node((4, 5), disk=disk)]
    assert choose(nodes) == (10, 4)
    assert [fetch_plan(nodes, i, 10, 4) for i in range(3)] == [{}, {}, {}]


def test_lagging_copies_do_not_cost_the_survivors_their_step() -> None:
    # world 3, node c lost: a and b hold their own ranks' newest steps (9, 10); the
    # copies they hold of c's rank lag (6, 7). The new world (ranks 0, 1) reads ranks 0
    # and 1 of world 3: step 10 is readable, whatever rank 2's copies say.
    a = node((0,), {9: {3: {0}}, 10: {3: {0}}, 6: {3: {2}}, 7: {3: {2}}})
    b = node((1,), {9: {3: {1}}, 10: {3: {1}}, 6: {3: {0}}, 7: {3: {0}}})
    assert choose([a, b]) == (10, 3)


def test_the_newest_step_a_node_cannot_get_gives_way_to_an_older_one() -> None:
    # step 12 of rank 1 was never saved (its worker died in the step): 10 for everyone
    a = node((0,), {10: {2: {0}}, 12: {2: {0}}})
    b = node((1,), {10: {2: {1}}})
    assert choose([a, b]) == (10, 2)
    assert missing(b, 12, 2, dcp=False) == (frozenset({1}), False)


def test_a_dcp_step_is_fetched_whole_with_its_metadata() -> None:
    # three nodes, one rank each; b and c hold their own file and their left
    # neighbour's copy, a only its own and the metadata (its coordinator wrote it)
    a = node((0,), {6: {3: {0}}}, metadata=(6,))
    b = node((1,), {6: {3: {1, 0}}})
    c = node((2,), {6: {3: {2, 1}}})
    assert choose([a, b, c]) == (6, 3)
    # a lacks 1 and 2: c sends both (one peer rather than two)
    assert fetch_plan([a, b, c], 0, 6, 3) == {2: frozenset({1, 2})}
    # b lacks 2 (from c) and the metadata: a sends it alone (no rank file)
    assert fetch_plan([a, b, c], 1, 6, 3) == {2: frozenset({2}), 0: frozenset()}
    # c lacks 0: a and b both hold it, a (the lower index) also has the metadata
    assert fetch_plan([a, b, c], 2, 6, 3) == {0: frozenset({0})}
    # without a server holding the metadata, b cannot read the step
    quiet = node((0,), {6: {3: {0}}}, metadata=(6,), serves=False)
    assert fetch_plan([quiet, b, c], 1, 6, 3) is None
    assert choose([quiet, b, c]) is None


def test_a_dcp_step_without_metadata_anywhere_is_not_resumed_from() -> None:
    a = node((0,), {4: {2: {0, 1}}, 6: {2: {0, 1}}}, metadata=(4,))
    b = node((1,), {4: {2: {0, 1}}, 6: {2: {0, 1}}}, metadata=(4,))
    assert choose([a, b]) == (4, 2)


def test_a_dcp_step_whole_on_the_disk_needs_no_fetch() -> None:
    disk = {6: {2: {0, 1}}}
    a = node((0,), disk=disk, disk_metadata=(6,))
    assert missing(a, 6, 2, dcp=True) == (frozenset(), False)


def test_holdings_travel_as_json_and_bad_ones_are_refused() -> None:
    a = node((0, 1, 2, 7), {8: {4: {0, 1, 2, 3}}}, {2: {8: {5}}}, metadata=(8,))
    raw = json.loads(json.dumps(a.to_json()))
    assert raw["ranks"] == [[0, 2], [7, 7]]
    assert Holdings.from_json(raw) == a
    for bad in (
        {**raw, "ranks": [[3, 1]]},
        {**raw, "memory": {"-5": {}}},
        {**raw, "ranks": [[0, 1 << 30]]},
        {k: v for k, v in raw.items() if k != "disk"},
    ):
        with pytest.raises((ValueError, KeyError, TypeError)):
            Holdings.from_json(bad)


def test_a_round_deletes_the_newer_steps_and_all_older_ones_but_a_fallback() -> None:
    assert to_delete([4, 6, 8, 10, 12], (8, 2)) == [4, 10, 12]
    assert to_delete([8], (8, 2)) == []
    assert to_delete([4, 6], None) == [4, 6]
