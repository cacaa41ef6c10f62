"""The ledger's categories, in one place (a new kind of badput is one more name here).

``productive`` plus the badput categories add up to the wall time. ``restart`` is
split by the cause of the failure it follows (``restart.crash``...). A category a
later feature fills through :meth:`~aelastic.goodput._recorder.GoodputRecorder.charge` (say
``straggler``: time the slowest rank lost to being slow) is added to ``CHARGED``.
"""

from __future__ import annotations

__all__ = (
    "BADPUT",
    "CATEGORIES",
    "CHARGED",
    "PRODUCTIVE",
    "RESTART_CAUSES",
    "UNREPORTED",
    "restart_category",
)

PRODUCTIVE = "productive"
#: Why an attempt ended, each with its own ``restart.<cause>`` category.
RESTART_CAUSES: tuple[str, ...] = ("crash", "hang", "node_loss", "membership", "exclusion")
#: Badput carved out of the stepping time by another component (``GoodputRecorder.charge``).
#: ``straggler``: the time a slow rank of this node cost its job, ``(1 - score)`` of each
#: second it was confirmed slow (``aelastic.stragglers``; score: its relative speed).
CHARGED: tuple[str, ...] = ("straggler",)
#: Stepping time of ranks that reported no step while their peers did: not known to be
#: productive (a rank's share of its node's time; in the job's ledger, a whole node's).
UNREPORTED = "unreported"
#: Every badput category, in the order the summary line and the page show them.
BADPUT: tuple[str, ...] = (
    "startup",
    *(f"restart.{cause}" for cause in RESTART_CAUSES),
    "detection",
    "rollback",
    "checkpoint_save",
    "checkpoint_load",
    "waiting",
    *CHARGED,
    UNREPORTED,
    "other",
)
CATEGORIES: tuple[str, ...] = (PRODUCTIVE, *BADPUT)


def restart_category(cause: str) -> str:
    """``restart.<cause>``; an unknown cause counts as a crash."""
    return f"restart.{cause if cause in RESTART_CAUSES else 'crash'}"
