"""The bounded history and the status table, as plain functions."""

from __future__ import annotations

import json

from aelastic.goodput._categories import BADPUT
from aelastic.goodput._ledger import Ledger
from aelastic.jobview import summarize
from aelastic.jobview._history import History
from aelastic.jobview._publish import due, period, progress_period
from aelastic.jobview._table import table
from aelastic.jobview._view import steps_per_second
from aelastic.launcher._launch import end_line


def test_history_keeps_the_whole_run_in_bounded_size() -> None:
    history = History(max_samples=8, max_marks=3)
    for t in range(1000):
        history.sample(float(t), [t, t + 1])
    times = [s[0] for s in history.samples]
    assert len(times) <= 8 and times[-1] == 999.0 and times[0] < 100  # old and recent kept
    assert times == sorted(times)
    for i in range(5):
        history.mark(float(i), "excluded" if i == 4 else "restart", "x" * 500)
    marks = history.to_json()["marks"]
    assert [m[1] for m in marks] == ["restart", "restart", "excluded"]  # the latest, any kind
    assert all(len(str(m[2])) == 160 for m in marks)
    assert len(json.dumps(history.to_json())) < 1000


def _doc(node: str, age: float, state: str = "HEALTHY", **kw: object) -> dict[str, object]:
    return {
        "v": 1, "node": node, "state": state, "round": 2, "group_rank": 0, "time": 1000.0 - age,
        "interval": 5.0, "restart_count": 0, "max_restarts": 3,
        "workers": [{"global_rank": 0, "local_rank": 0, "pid": 1, "step": 40,
                     "heartbeat_age_ms": 120}],
        "history": {"samples": [[990.0, 20], [995.0, 30]], "marks": []},
        **kw,
    }  # fmt: skip


def test_steps_per_second_staleness_and_a_terminal_node() -> None:
    view = summarize(
        "r",
        [_doc("a", 2), _doc("b", 60), _doc("c", 60, state="SUCCEEDED", group_rank=1)],
        now=1000.0,
    )
    by = {n["node"]: n for n in view["nodes"]}
    assert by["a"]["steps_per_s"] == 2.0 and by["a"]["step"] == 40
    assert not by["a"]["stale"] and by["b"]["stale"] and not by["c"]["stale"]
    assert by["b"]["age_s"] == 60.0


def test_the_table_cannot_be_steered_by_control_characters() -> None:
    failure = {"global_rank": 3, "message": "exited 1\x1b[2J\x1b]0;owned\x07"}
    view = summarize("r", [_doc("evil\x1b[31mnode\r\n", 90, last_failure=failure)], now=1000.0)
    text = table(view)
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    lines = text.splitlines()
    assert len(lines) == 3 and "evil?[31mnode??" in lines[2]
    assert "HEALTHY (stale 90s)" in lines[2] and "rank 3 exited 1?[2J" in lines[2]


def _record(wall: float, productive: float) -> dict[str, object]:
    """A node's goodput record: ``productive`` of ``wall`` seconds, the rest startup."""
    badput = dict.fromkeys(BADPUT, 0.0)
    badput["startup"] = wall - productive
    return {"wall_s": wall, "productive_s": productive, "ratio": productive / wall,
            "badput_s": badput, "steps_kept": 10, "steps_lost": 0}  # fmt: skip


def test_goodput_column_and_the_combined_breakdown() -> None:
    docs = [_doc("a", 2, goodput=_record(10.0, 9.0)), _doc("b", 2, goodput=_record(5.0, 2.0))]
    view = summarize("r", [*docs, _doc("c", 2)], now=1000.0)
    # node-seconds, scaled to the longest wall time: a node that left keeps its share
    assert view["goodput"]["productive_s"] == round(10.0 * 11.0 / 15.0, 3)
    lines = table(view).splitlines()
    assert "GOODPUT" in lines[1]
    assert "90.0%" in lines[2] and "40.0%" in lines[3] and "40.0%" not in lines[4]
    assert lines[-1] == "job goodput 73.3% of 10.0 s: startup 2.7 s"


def test_the_replica_groups_section_of_the_table() -> None:
    view = summarize("job-rg0", [], now=100.0)
    assert "replica groups" not in table(view)  # not a replica-group job: no section
    member = {"replica_id": "rg1:\x1b[2Jx", "step": 7, "world_size": 1}
    view["replica_groups"] = {
        "groups_total": 2,
        "groups": [
            {"group": 0, "state": "excluded", "nodes": [], "step": None, "restarts": 2,
             "replaced": 1, "replica_id": None},
            {"group": 1, "state": "running", "nodes": [{"node": "h:1"}], "step": 7,
             "restarts": 0, "replaced": 0, "replica_id": member["replica_id"]},
        ],
        "lighthouse": "http://127.0.0.1:9",
        "lighthouse_restarts": 1,
        "quorum": {"quorum_id": 5, "members": [member]},
        "membership": [[100.0, 4, ["rg0:a", "rg1:b"]], [101.0, 5, ["rg1:b"]]],
    }  # fmt: skip
    text = table(view)
    assert "\x1b" not in text  # a replica id cannot steer the terminal
    lines = text.splitlines()
    assert "2 in all, 2 run by this node's runner" in text and "(restarted 1 time(s))" in text
    assert any(line.split()[:6] == ["0", "excluded", "-", "-", "2", "1"] for line in lines)
    assert any(line.split()[:4] == ["1", "running", "h:1", "7"] for line in lines)
    assert "quorum 5: rg1:?[2Jx (step 7)" in text
    assert [line.split(" quorum ")[1] for line in lines if line.startswith("  ")] == [
        "4: rg0:a, rg1:b",
        "5: rg1:b",
    ]


def test_a_node_writes_on_progress_each_second_up_to_300_nodes() -> None:
    # issue 40: a two-node job's status showed a step 5 s old
    assert progress_period(5.0, 2) == 1.0 and progress_period(5.0, 300) == 1.0
    assert progress_period(5.0, 301) == 5.0 and progress_period(5.0, 1000) == 10.0
    assert period(5.0, 1000) == 10.0  # large runs keep the periodic bound alone
    assert due(True, 1.0, 5.0, 2) and not due(False, 1.0, 5.0, 2) and due(False, 5.0, 5.0, 2)
    assert not due(True, 0.5, 5.0, 2)  # at most one progress write a second
    assert not due(True, 5.0, 5.0, 1000) and due(True, 10.0, 5.0, 1000)


def test_steps_per_second_is_the_current_attempt_s_recent_rate() -> None:
    # 50 steps at 5 steps/s, a restart at t=11 (new workers import for 9 s, then resume
    # from the checkpoint at step 40, 4 steps/s): the 1.17 spanned the restart
    before = [[float(t), 5 * t] for t in range(11)]
    after = [[20.0, None], [21.0, 40], [22.0, 44], [23.0, 48], [24.0, 52]]
    marks = [[11.0, "restart", "#1: rank 1 exited 3"]]
    assert steps_per_second(before + after, marks) == 4.0
    assert steps_per_second(before + after[:2], marks) is None  # one sample: no rate yet
    # no mark (a node that missed it): a lower step starts the attempt, None too
    assert steps_per_second(before + after[1:]) == 4.0
    # the window: the rate over the last 30 s, not since the attempt began
    slow_then_fast = [[float(t), t] for t in range(100)] + [[130.0, 99 + 90]]
    assert steps_per_second(slow_then_fast) == round(90 / 31, 3)
    assert steps_per_second(slow_then_fast, window=1000) == round(189 / 130, 3)
    # samples sparser than the window: the last two
    assert steps_per_second([[0.0, 0], [100.0, 50]]) == 0.5


def test_waiting_ranks_and_no_ratio_without_steps() -> None:
    waiting = [{"global_rank": -1, "local_rank": i, "pid": None, "step": None} for i in (0, 1)]
    unknown = {"wall_s": 10.0, "productive_s": 9.96, "ratio": 0.996, "steps_kept": None,
               "badput_s": dict.fromkeys(BADPUT, 0.0), "steps_lost": None}  # fmt: skip
    view = summarize("r", [_doc("a", 1, workers=waiting, goodput=unknown)], now=1000.0)
    row = table(view).splitlines()[2].split()
    assert row[3] == "waiting" and "-1,-1" not in row
    assert "99.6%" not in table(view) and "goodput unknown" in table(view)


def test_the_end_line_is_the_job_s() -> None:
    a, b = _record(10.0, 8.0), _record(10.0, 9.0)  # 80% and 90%: the two lines
    view = summarize("r", [_doc("a", 1, goodput=a), _doc("b", 1, goodput=b)], now=1000.0)
    own = Ledger.from_record(a)
    assert end_line(view, own) == "goodput 85.0% of 10.0 s (the job's, 2 nodes): startup 1.5 s"
    alone = summarize("r", [_doc("a", 1, goodput=a)], now=1000.0)
    assert end_line(alone, own) == "goodput 80.0% of 10.0 s: startup 2.0 s"
    assert end_line(None, own, alone=True) == "goodput 80.0% of 10.0 s: startup 2.0 s"
    assert "this node's: the job's view could not be read" in str(end_line(None, own))
    assert end_line(None, None) is None
