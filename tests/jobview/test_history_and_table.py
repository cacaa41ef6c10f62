"""The bounded history and the status table, as plain functions."""

from __future__ import annotations

import json

from aelastic.goodput import BADPUT
from aelastic.jobview import History, summarize, table


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


def test_goodput_column_and_the_combined_breakdown() -> None:
    def record(wall: float, productive: float) -> dict[str, object]:
        badput = dict.fromkeys(BADPUT, 0.0)
        badput["startup"] = wall - productive
        return {"wall_s": wall, "productive_s": productive, "ratio": productive / wall,
                "badput_s": badput, "steps_kept": 10, "steps_lost": 0}  # fmt: skip

    docs = [_doc("a", 2, goodput=record(10.0, 9.0)), _doc("b", 2, goodput=record(5.0, 2.0))]
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
