"""Progress reporting for workers, and what the agent reads of it: hangs, and the steps
and checkpoint times of the goodput ledger (``aelastic.goodput``; on for every job).

In a worker::

    from aelastic.progress import heartbeat, section, step

    for batch in loader:
        with section("train_step"):
            ...
        step()          # or heartbeat()

Importing this package loads neither torch nor anyio nor the agent; each call
costs well under a microsecond and makes no system call. A worker that never
imports it is never judged by the hang-detection timeouts. The agent side
(:class:`ProgressFile`, :class:`ProgressTimeouts`) lives here too so both sides
share one layout.
"""

from ._worker import attached as attached
from ._worker import checkpoint_blocked as checkpoint_blocked
from ._worker import heartbeat as heartbeat
from ._worker import section as section
from ._worker import step as step
from ._worker import work_timed as work_timed

__all__ = (
    "attached",
    "checkpoint_blocked",
    "heartbeat",
    "section",
    "step",
    "work_timed",
)
