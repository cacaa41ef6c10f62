"""The ``aelastic status`` table: one row per node, plain text, aligned columns.

Every string from the job goes through :func:`printable` first: a node name or an
error message cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

from typing import Any

__all__ = ("printable", "table")

_COLUMNS = (
    "NODE",
    "STATE",
    "ROUND",
    "RANKS",
    "STEP",
    "STEPS/S",
    "HEARTBEAT",
    "RESTARTS",
    "GOODPUT",
    "SLOW",
    "LAST FAILURE",
)
_MAX_CELL = 60


def printable(value: Any, limit: int = _MAX_CELL) -> str:
    """``value`` as one line of printable text (control characters shown as ``?``), at
    most ``limit`` characters."""
    text = "-" if value is None else str(value)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ranks(workers: list[dict[str, Any]]) -> str:
    ranks = sorted(w["global_rank"] for w in workers if isinstance(w.get("global_rank"), int))
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _state(node: dict[str, Any]) -> str:
    state = str(node.get("state"))
    return f"{state} (stale {node['age_s']:.0f}s)" if node.get("stale") else state


def _failure(node: dict[str, Any]) -> str:
    failure = node.get("last_failure")
    if not isinstance(failure, dict):
        return "-"
    return f"rank {failure.get('global_rank')} {failure.get('message', '')}".strip()


def _ratio(record: Any) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("ratio"), (int, float)):
        return "-"
    return f"{100 * record['ratio']:.1f}%"


def _slow(node: dict[str, Any]) -> str:
    """``node 0.70`` (every rank slow) or ``rank 3 0.71`` from the node's straggler
    verdict; ``-`` when it is not slow (or detection is off)."""
    stragglers = node.get("stragglers")
    slow = stragglers.get("slow") if isinstance(stragglers, dict) else None
    if not isinstance(slow, dict) or not slow.get("ranks"):
        return "-"
    ranks = slow["ranks"]
    if slow.get("whole_node"):
        return f"node {min(ranks.values()):.2f}"
    return "rank " + ",".join(f"{r} {s:.2f}" for r, s in ranks.items())


def _row(node: dict[str, Any]) -> list[str]:
    beat = node.get("heartbeat_age_ms")
    rate = node.get("steps_per_s")
    restarts = f"{node.get('restart_count')}/{node.get('max_restarts')}"
    return [
        printable(node.get("node")),
        printable(_state(node)),
        printable(node.get("round")),
        _ranks(node.get("workers") or []),
        printable(node.get("step")),
        "-" if rate is None else f"{rate:.2f}",
        "-" if beat is None else f"{beat / 1000:.1f}s",
        printable(restarts),
        _ratio(node.get("goodput")),
        printable(_slow(node)),
        printable(_failure(node)),
    ]


def table(view: dict[str, Any]) -> str:
    """The job view (:func:`~aelastic.jobview.summarize`) as a header line and a table."""
    rows = [list(_COLUMNS)] + [_row(n) for n in view["nodes"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    stale = sum(1 for n in view["nodes"] if n.get("stale"))
    head = (
        f"run {printable(view['run_id'])}: {len(view['nodes'])} nodes, round "
        f"{printable(view['round'])}" + (f", {stale} stale" if stale else "")
    )
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    summary = view.get("goodput_summary")
    breakdown = [f"job {printable(summary, 400)}"] if summary else []
    return "\n".join([head, *lines, *breakdown])
