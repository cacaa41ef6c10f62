"""When a forming round may skip its last call: its previous round's members rejoined.

A ``MIN:MAX`` round that reached ``min_nodes`` waits the last call
(``last_call_timeout``) for more nodes up to ``max_nodes``: nodes still arriving.
After a restart (a worker failed, a node asked for a new round) the nodes that come
back are the previous round's members; when all of them are in again and no other
node took a ticket in the previous round after it completed (a late arrival or a
spare, which is coming to this round too), nobody is arriving: the coordinator
closes the round at once instead of waiting for a node that is not coming.

What still waits the last call:

* the first round of a job (no previous round: the last call is for nodes starting);
* a round after a node loss (fewer members than the previous round: the survivors
  cannot tell a dead node from one about to come back);
* a round with a newcomer (a ticket with no previous round, or from another round or
  store epoch), or where a node waited or was a spare in the previous round.

Plain decisions; :class:`~._coordinator.RoundCoordinator` (c10d) and the etcd
backend's handler read the store and call them. Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._dataclass import dataclass
from ._placement import Seat

__all__ = ("Previous", "worth_checking", "may_close_now", "same_members")


@dataclass(frozen=True)
class Previous:
    """The round a node was last admitted to, as the node saw its ``running`` tick."""

    #: the store incarnation (see :class:`~._state.Keys`)
    epoch: int
    round: int
    #: this node's group rank there
    rank: int
    #: how many members it had
    world: int
    #: how many tickets had been taken when it completed (members and withdrawn ones)
    upto: int


def worth_checking(previous: Previous | None, epoch: int, live: int) -> bool:
    """Whether a coordinator that was last admitted to ``previous`` and now counts
    ``live`` tickets in a round of store epoch ``epoch`` should read the tickets'
    descriptors to see whether :func:`may_close_now` holds (no store request otherwise)."""
    return previous is not None and previous.epoch == epoch and live == previous.world


def may_close_now(
    previous: Previous | None,
    epoch: int,
    others: Sequence[Seat | None],
    joined_before: int,
) -> bool:
    """Whether a forming round may close now, without its last call.

    ``previous``: the coordinator's own previous round (None: it has none). ``epoch``:
    the store epoch of the forming round. ``others``: the seats of the other live
    tickets, from their descriptors (None: no descriptor). ``joined_before``: the
    tickets taken in the previous round (read from the store now).

    True exactly when the live tickets are the previous round's members, each once,
    and nobody took a ticket in the previous round after it completed.
    """
    if previous is None or previous.epoch != epoch:
        return False
    if len(others) + 1 != previous.world or joined_before != previous.upto:
        return False
    ranks = {previous.rank}
    for seat in others:
        last = None if seat is None else seat.last
        if last is None or last[:2] != (epoch, previous.round) or last[2] in ranks:
            return False
        ranks.add(last[2])
    return ranks == set(range(previous.world))


def same_members(previous: Sequence[str], joined: Sequence[str]) -> bool:
    """Whether the node ids that ``joined`` a forming round are exactly those of the
    previous round (etcd: a node waiting for the next round is one of its joiners, so
    this also says that nobody else is arriving)."""
    return len(joined) == len(previous) and sorted(joined) == sorted(previous)
