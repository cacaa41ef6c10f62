"""Plain decisions of straggler exclusion (``--straggler-action exclude``).

No I/O, no awaiting: :class:`._watch.StragglerWatch` reads the job's record of
exclusions from the store, asks these functions, and excludes. The rules:

* **due**: this node is excluded once the slow ranks it is excluded *for* have been slow
  for ``min_duration + timeout`` seconds (from the onset the tracker saw);
* **backoff**: at most one exclusion per set of workers (a round), and none sooner than
  :attr:`StragglerSettings.exclude_backoff` seconds (``warmup + min_duration + timeout``,
  200 s by default) after this node's previous one: after an exclusion, the next one
  is confirmed from scratch on new workers;
* **failures**: an exclusion that raised is retried at the next sample, at most
  :data:`EXCLUDE_ATTEMPTS` times per set of workers (new workers start the count over);
* **the workload, not the node**: a slow global rank for which *another* node was
  excluded earlier in the job is slow because of its work (rank 0 evaluating, a heavier
  shard), not because of the node that took the excluded node's place: it is reported
  and no longer counts toward an exclusion of any node (it would use up the spares
  one by one). The job's record of straggler exclusions (``{node, ranks}``, one per
  exclusion) is what says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from .._dataclass import dataclass
from ._settings import StragglerSettings

__all__ = (
    "EXCLUDE_ATTEMPTS",
    "ExcludedFor",
    "exclusion_due",
    "parse_record",
    "workload_ranks",
)

#: Failed exclusions (``exclude`` raised) tried per set of workers before giving up.
EXCLUDE_ATTEMPTS = 3


@dataclass(frozen=True)
class ExcludedFor:
    """One straggler exclusion of the job: ``node`` was excluded for its slow global
    ``ranks``."""

    node: str
    ranks: tuple[int, ...]

    def line(self) -> str:
        """This exclusion as one line of the job's record (JSON, newline-terminated)."""
        return json.dumps({"node": self.node, "ranks": list(self.ranks)}) + "\n"


def parse_record(text: str) -> list[ExcludedFor]:
    """The exclusions of the job's record (one JSON object a line), oldest first. A line
    that does not parse (cut short, written by something else) is skipped: never raises."""
    out = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            out.append(ExcludedFor(str(data["node"]), tuple(int(r) for r in data["ranks"])))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def workload_ranks(
    node: str, ranks: Iterable[int], record: Iterable[ExcludedFor]
) -> dict[int, tuple[str, ...]]:
    """Those of ``ranks`` (slow on ``node``) for which another node was excluded earlier
    in the job, each with the nodes excluded for it (oldest first): their slowness
    followed the rank to the node that took the excluded node's place, so it is the
    rank's work. ``node``'s own exclusions do not count (a node slow again with the
    same rank is still suspect). {} when none."""
    wanted = set(ranks)
    found: dict[int, list[str]] = {}
    for exclusion in record:
        if exclusion.node == node:
            continue
        for rank in wanted.intersection(exclusion.ranks):
            nodes = found.setdefault(rank, [])
            if exclusion.node not in nodes:
                nodes.append(exclusion.node)
    return {rank: tuple(nodes) for rank, nodes in sorted(found.items())}


def exclusion_due(
    settings: StragglerSettings,
    now: float,
    since: float | None,
    *,
    excluded: bool,
    attempts: int,
    last: float | None,
) -> bool:
    """Whether to exclude this node now (action ``exclude``): its counted slow ranks have
    been slow since ``since`` (None: none is) for ``min_duration + timeout``; it was not
    excluded yet for its current workers (``excluded``), has failed fewer than
    :data:`EXCLUDE_ATTEMPTS` tries for them (``attempts``), and its previous exclusion
    (``last``, None: none) is at least ``settings.exclude_backoff`` seconds old."""
    if settings.action != "exclude" or since is None or excluded:
        return False
    if attempts >= EXCLUDE_ATTEMPTS:
        return False
    if last is not None and now - last < settings.exclude_backoff:
        return False
    return now - since >= settings.min_duration + settings.timeout
