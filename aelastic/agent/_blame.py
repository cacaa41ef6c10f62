"""Which of the hung workers is the root cause: a plain decision, from progress and stacks.

In a collective every rank waits on the slowest one, so once a worker stops, its
peers stop too, a moment later, usually at the same step. The least advanced worker
(lowest step) is the root cause; at the same step, the one that is *not* inside a
collective is: the others wait in it for that one. Only then does the oldest sign
of progress decide (a rank that stops before its all-reduce and the rank blocked in
that all-reduce both entered the step at about the same time, so the heartbeat
order alone is a coin toss).

"Inside a collective" is read from the worker's captured Python stacks (faulthandler's
or py-spy's format): a frame of ``torch.distributed`` (a collective, a barrier, a
``wait()``), of DDP's forward (its buffer broadcast), or of autograd's backward
(DDP all-reduces the gradients inside ``loss.backward()``). No stacks (a dump that
did not finish in time, under load): unknown, ranked after a worker known to be
outside any collective and before one known to be inside (nothing says it waits on a
peer, and nothing says it does not).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .._dataclass import dataclass

__all__ = ("Suspect", "blame_order", "in_collective")

# "torch/distributed/..." after a path separator, a quote, a parenthesis or a space:
# faulthandler writes absolute paths, py-spy often paths relative to site-packages.
_COLLECTIVE_FRAME = re.compile(
    r"""(?:^|[\s("'/])torch/(?:distributed/|nn/parallel/distributed\.py|autograd/)""",
    re.MULTILINE,
)


def in_collective(stacks: str | None) -> bool | None:
    """Whether a thread of these stacks is in a collective; None when there are no stacks."""
    if not stacks or not stacks.strip():
        return None
    return _COLLECTIVE_FRAME.search(stacks) is not None


@dataclass(frozen=True)
class Suspect:
    """One worker past its progress deadline, as the blame decision sees it."""

    local_rank: int
    #: Its latest reported step (-1: none).
    step: int
    #: Its latest sign of progress (monotonic ns): heartbeat, section entry or exit.
    last_progress_ns: int
    #: From its stacks: True inside a collective, False outside, None unknown.
    collective: bool | None = None


def blame_order(suspects: Sequence[Suspect]) -> list[int]:
    """The local ranks of ``suspects``, the root cause first.

    Ordered by lowest step, then outside a collective, unknown, inside one, then
    oldest progress, then local rank (a stable answer for a full tie).
    """
    ordered = sorted(
        suspects,
        key=lambda s: (s.step, _COLLECTIVE_RANK[s.collective], s.last_progress_ns, s.local_rank),
    )
    return [s.local_rank for s in ordered]


#: Outside a collective first, unknown next, inside last.
_COLLECTIVE_RANK: dict[bool | None, int] = {False: 0, None: 1, True: 2}
