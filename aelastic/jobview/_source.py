"""``NodeSource``: what the job view reads of one node's job (``aelastic.Job`` is one).

Structural types, so this package depends on nothing above it: the launcher's ``Job``
satisfies them (mypy checks that where the launcher starts the publisher), and so does
any object a test or another front end builds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..health import JobView
from ..health._view import WorkerView

if TYPE_CHECKING:
    from ..agent import WorkerState
    from ..progress._reader import ProgressSnapshot

__all__ = ("Change", "NodeSource", "RankedWorker")


class RankedWorker(WorkerView, Protocol):
    """One local worker as the view lists it."""

    @property
    def global_rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...


class Change(Protocol):
    """One state transition of the node's worker group."""

    @property
    def state(self) -> WorkerState: ...
    @property
    def round(self) -> int | None: ...
    @property
    def restart_count(self) -> int: ...
    @property
    def remaining_restarts(self) -> int: ...
    @property
    def timestamp(self) -> float: ...


class NodeSource(JobView, Protocol):
    """The health endpoint's view of a job, plus its group rank, progress and changes.

    Every member is read on the event loop and must not block.
    """

    @property
    def group_rank(self) -> int | None: ...
    def progress(self) -> Mapping[int, ProgressSnapshot]: ...
    def workers(self) -> Sequence[RankedWorker]: ...
    def state_changes(self) -> AsyncIterator[Change]: ...
