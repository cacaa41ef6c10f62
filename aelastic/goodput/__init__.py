"""Goodput: where each second of a run went, split into categories that add up to it.

``productive`` (the time of the steps that are kept) and the badput categories
(:data:`BADPUT`: ``startup``, ``restart.<cause>``, ``detection``, ``rollback``,
``checkpoint_save``, ``checkpoint_load``, ``waiting``, ``straggler``, ``unreported``,
``other``), computed from the facts the agent sees (:class:`GoodputRecorder`) by plain
functions (:func:`compute`, :func:`combine` for the whole job; the rules they apply:
:func:`new_count`, :func:`silent_share`, :func:`job_charge`, :func:`job_steps`). See
``docs/goodput.md`` for the definitions.
Imports nothing but the standard library.
"""

from ._categories import BADPUT as BADPUT
from ._categories import CATEGORIES as CATEGORIES
from ._ledger import COUNTER_START as COUNTER_START
from ._ledger import Attempt as Attempt
from ._ledger import Ledger as Ledger
from ._ledger import RankSteps as RankSteps
from ._ledger import combine as combine
from ._ledger import compute as compute
from ._ledger import job_charge as job_charge
from ._ledger import job_steps as job_steps
from ._ledger import new_count as new_count
from ._ledger import silent_share as silent_share
from ._recorder import GoodputRecorder as GoodputRecorder

__all__ = (
    "BADPUT",
    "CATEGORIES",
    "COUNTER_START",
    "Attempt",
    "GoodputRecorder",
    "Ledger",
    "RankSteps",
    "combine",
    "compute",
    "job_charge",
    "job_steps",
    "new_count",
    "silent_share",
)
