"""The ``aelastic status`` table: one row per node, plain text, aligned columns.

Every string from the job goes through :func:`printable` first: a node name or an
error message cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

from typing import Any

__all__ = ("printable", "replica_lines", "table")

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
    """``0-3``, ``0,2``; ``waiting`` for a node whose workers have no rank yet (not in a
    round: they show as -1); ``-`` without workers."""
    ranks = sorted(w["global_rank"] for w in workers if isinstance(w.get("global_rank"), int))
    if not ranks:
        return "-"
    if ranks[-1] < 0:
        return "waiting"
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
    """A node's goodput ratio; ``-`` without steps (its running time is not known to be
    goodput: ``aelastic run``'s end line says ``goodput unknown`` too)."""
    if not isinstance(record, dict) or not isinstance(record.get("ratio"), (int, float)):
        return "-"
    if record.get("steps_kept") is None:
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


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _clock(when: Any) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(float(when))) if when else "-"


def replica_lines(record: dict[str, Any]) -> list[str]:
    """A replica-group job's record (``view["replica_groups"]``) as lines: the groups
    this node's runner knows, the quorum's members, its membership changes."""
    groups = record.get("groups") or []
    restarts = record.get("lighthouse_restarts") or 0
    lines = [
        f"replica groups: {printable(record.get('groups_total'))} in all, "
        f"{len(groups)} run by this node's runner; Lighthouse "
        f"{printable(record.get('lighthouse'))}"
        + (f" (restarted {restarts} time(s))" if restarts else "")
    ]
    rows = [["GROUP", "STATE", "NODES", "STEP", "RESTARTS", "SPARES USED", "IN QUORUM AS"]]
    for g in groups:
        nodes = g.get("nodes") or []
        rows.append(
            [
                printable(g.get("group")),
                printable(g.get("state")),
                printable(",".join(str(n.get("node")) for n in nodes) or None),
                printable(g.get("step")),
                printable(g.get("restarts")),
                printable(g.get("replaced")),
                printable(g.get("replica_id")),
            ]
        )
    lines += _aligned(rows)
    for g in groups:
        if g.get("last_failure"):  # names the group and the quorum it left
            lines.append(f"last failure: {printable(g['last_failure'], 300)}")
    quorum = record.get("quorum")
    if isinstance(quorum, dict) and quorum.get("quorum_id") is not None:
        members = ", ".join(
            f"{printable(m.get('replica_id'))} (step {printable(m.get('step'))})"
            for m in quorum.get("members") or []
        )
        lines.append(f"quorum {printable(quorum['quorum_id'])}: {members or '-'}")
    elif record.get("quorum_error"):
        lines.append(f"quorum: {printable(record['quorum_error'], 200)}")
    for when, quorum_id, members in record.get("membership") or []:
        names = ", ".join(printable(m) for m in members) or "-"
        lines.append(f"  {_clock(when)} quorum {printable(quorum_id)}: {names}")
    return lines


def table(view: dict[str, Any]) -> str:
    """The job view (:func:`~aelastic.jobview.summarize`) as a header line and a table."""
    rows = [list(_COLUMNS)] + [_row(n) for n in view["nodes"]]
    stale = sum(1 for n in view["nodes"] if n.get("stale"))
    head = (
        f"run {printable(view['run_id'])}: {len(view['nodes'])} nodes, round "
        f"{printable(view['round'])}" + (f", {stale} stale" if stale else "")
    )
    lines = _aligned(rows)
    summary = view.get("goodput_summary")
    breakdown = [f"job {printable(summary, 400)}"] if summary else []
    record = view.get("replica_groups")
    replicas = replica_lines(record) if isinstance(record, dict) else []
    return "\n".join([head, *lines, *breakdown, *replicas])
