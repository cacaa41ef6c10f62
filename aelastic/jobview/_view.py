"""Reading a run's node statuses from the store, and what the readers derive from them.

:func:`read_view` costs two requests however many nodes there are: the index, then
every status in one ``multi_get``. :func:`summarize` adds per node its step (the
slowest local worker's), steps per second (:func:`steps_per_second`: over the last
``RATE_WINDOW`` seconds of the current attempt), heartbeat
age, the status's age and whether it is stale (a running node that stopped
publishing: its agent or host is gone, or cut off from the store).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ..goodput import combine
from ..store import Store
from ._exceptions import JobViewError
from ._keys import INDEX_KEY, REPLICAS_KEY, node_key
from ._node import FORMAT

__all__ = ("read_replicas", "read_statuses", "read_view", "summarize")

_TERMINAL = ("SUCCEEDED", "FAILED")


async def read_statuses(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Every node's last status document in ``store`` (a run's status store).

    Raises:
        JobViewError: no node of ``run_id`` has published there.
        StoreError: the store failed (unreachable, timed out).
    """
    if not await store.check([INDEX_KEY]):
        raise JobViewError(
            f"no node of run {run_id!r} has published its status in this store: check the "
            "run id (--rdzv-id) and the endpoint; nodes publish once they have joined"
        )
    index = (await store.get(INDEX_KEY)).decode("utf-8", "replace")
    nodes = list(dict.fromkeys(line for line in index.split("\n") if line))
    docs = []
    for raw in await store.multi_get([node_key(n) for n in nodes]) if nodes else []:
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("v") == FORMAT:
            docs.append(doc)
    return docs


async def read_view(store: Store, run_id: str, now: float | None = None) -> dict[str, Any]:
    """:func:`summarize` of :func:`read_statuses` (same errors), with ``replica_groups``:
    the replica-group record of a torchft job (``run --replica-groups``), else None."""
    view = summarize(run_id, await read_statuses(store, run_id), now)
    view["replica_groups"] = await read_replicas(store)
    return view


async def read_replicas(store: Store) -> dict[str, Any] | None:
    """The replica-group record in a run's status store (see ``aelastic.replicas``), or
    None when the run is not a replica group or the record is not one we read."""
    if not await store.check([REPLICAS_KEY]):
        return None
    try:
        doc = json.loads(await store.get(REPLICAS_KEY))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("v") == FORMAT else None


def _min_step(steps: list[Any]) -> int | None:
    known = [s for s in steps if isinstance(s, int) and s >= 0]
    return min(known) if known else None


#: Seconds of recent samples :func:`steps_per_second` measures over.
RATE_WINDOW = 30.0
#: Marks after which the node runs new workers: samples before them are another attempt's.
ATTEMPT_MARKS = ("restart", "node_lost", "membership")


def steps_per_second(
    samples: Sequence[Sequence[Any]],
    marks: Sequence[Sequence[Any]] = (),
    window: float = RATE_WINDOW,
) -> float | None:
    """The slowest local worker's steps per second in the current attempt, over its
    last ``window`` seconds of samples (``[time, step per local rank...]``).

    The current attempt's samples are those after the last mark of
    :data:`ATTEMPT_MARKS` (``[time, kind, detail]``) and after the last sample without
    a step or with a lower step than the one before (new workers): a rate never spans a
    restart's start-up, nor an old attempt's steps. None: fewer than two such samples.
    """
    start = max((float(m[0]) for m in marks if len(m) > 1 and m[1] in ATTEMPT_MARKS), default=-1.0)
    run: list[tuple[float, int]] = []
    for when, *steps in samples:
        t, step = float(when), _min_step(steps)
        if t <= start or step is None or (run and step < run[-1][1]):
            run = []  # before the attempt, or new workers (not started, counting anew)
            if t <= start or step is None:
                continue
        run.append((t, step))
    if len(run) < 2:
        return None
    t1, b = run[-1]
    recent = [(t, s) for t, s in run[:-1] if t >= t1 - window]
    t0, a = recent[0] if recent else run[-2]  # samples sparser than the window: the last two
    if not t1 > t0:
        return None
    return round((b - a) / (t1 - t0), 3)


def summarize(run_id: str, docs: list[dict[str, Any]], now: float | None = None) -> dict[str, Any]:
    """The job view: ``{"run_id", "time", "round", "nodes": [...]}``, the nodes sorted by
    group rank, each its status plus ``step``, ``steps_per_s``, ``heartbeat_age_ms``,
    ``age_s`` and ``stale``; ``goodput`` combines the nodes' ledgers (every node that
    published one, those that left included: :func:`aelastic.goodput.combine`)."""
    wall = time.time() if now is None else now
    nodes = []
    for doc in docs:
        node = dict(doc)
        workers = node.get("workers") or []
        history = node.get("history") or {}
        age = max(0.0, wall - float(node.get("time") or 0.0))
        interval = float(node.get("interval") or 5.0)
        beats = [
            w.get("heartbeat_age_ms") for w in workers if w.get("heartbeat_age_ms") is not None
        ]
        node["step"] = _min_step([w.get("step") for w in workers])
        node["steps_per_s"] = steps_per_second(
            history.get("samples") or [], history.get("marks") or []
        )
        node["heartbeat_age_ms"] = max(beats) if beats else None
        node["age_s"] = round(age, 1)
        node["stale"] = node.get("state") not in _TERMINAL and age > max(3 * interval, 10.0)
        nodes.append(node)
    nodes.sort(
        key=lambda n: (n.get("group_rank") is None, n.get("group_rank") or 0, str(n.get("node")))
    )
    rounds = [n["round"] for n in nodes if isinstance(n.get("round"), int) and not n["stale"]]
    ledger = combine([n["goodput"] for n in nodes if isinstance(n.get("goodput"), dict)])
    return {
        "run_id": run_id,
        "time": round(wall, 2),
        "round": max(rounds, default=None),
        "goodput": None if ledger is None else ledger.record(),
        "goodput_summary": None if ledger is None else ledger.summary(),
        "nodes": nodes,
    }
