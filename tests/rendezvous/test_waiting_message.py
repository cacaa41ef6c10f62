"""The "still waiting" line of an elastic node: short of peers vs. in the last call."""

from __future__ import annotations

from aelastic.rendezvous._waiting import waiting_message


def _line(joined: int | None, min_nodes: int = 2, max_nodes: int = 3) -> str:
    return waiting_message(
        backend="c10d",
        run_id="job",
        endpoint="127.0.0.1:29400",
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        waited=30.0,
        join_timeout=600.0,
        progress=f"round 1: {joined} nodes joined",
        joined=joined,
        last_call_timeout=45.0,
    )


def test_below_min_asks_for_the_other_nodes() -> None:
    line = _line(1)
    assert "Start the other nodes with --rdzv-backend c10d" in line
    assert "--rdzv-endpoint 127.0.0.1:29400 --rdzv-id job" in line
    assert "last call" not in line


def test_min_met_says_last_call_its_length_and_how_to_change_it() -> None:
    line = _line(2)
    assert "Start the other nodes" not in line
    assert "min_nodes=2 is met" in line
    assert "max_nodes=3" in line
    assert "last call for more nodes (45 s" in line
    assert "--rdzv-conf last_call_timeout=SECONDS" in line


def test_unknown_joins_keep_the_old_line() -> None:
    """A backend that does not pass its joins (etcd) keeps the line that asks for peers."""
    assert "Start the other nodes" in _line(None)


def test_full_round_is_not_a_last_call() -> None:
    assert "last call" not in _line(3)
