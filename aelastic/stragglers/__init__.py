"""Finding the slow node while the job runs (stragglers), and taking it out.

Every agent samples its workers' *busy time* (time on a CPU, from ``/proc``: nothing
runs in the worker, the script is unchanged), shares each rank's
median busy rate over ``--straggler-window`` through the rendezvous store, and scores
every rank: relative score = the fastest rank's median / this rank's, individual score
= its best past median / its current one. A rank whose relative score stays below
``--straggler-threshold`` for ``--straggler-min-duration`` is slow; a node whose every
rank is slow is named as a node. ``--straggler-action report`` (default) logs a
``straggler:`` line, records an ``aelastic.straggler`` event, marks the job view and
shows the scores in ``/status``, ``/metrics`` and ``aelastic status``; ``exclude`` also
excludes the node (``aelastic.nodes``) once it has been slow for ``--straggler-timeout``.
Where CPU time does not show the work (GPU jobs), one line in the training script,
:func:`time_work` (a DDP communication hook), times each rank's own work between its
all-reduces instead.
Decisions are plain functions (:mod:`._policy`); :class:`StragglerWatch` runs them.
See ``docs/stragglers.md``.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._hook import time_work as time_work
    from ._policy import SlowInterval as SlowInterval

__all__ = (
    "SlowInterval",
    "time_work",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
