"""``JobView``: what the health endpoint reads of a job (``aelastic.Job`` is one).

A structural type, so this package depends on nothing above it: the launcher's
``Job`` satisfies it, and so does any object a test or another front end builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from ..agent import WorkerState

__all__ = ("JobView", "WorkerView")


class WorkerView(Protocol):
    """One local worker as reported: a dataclass (``/status`` lists its fields) with a pid."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def pid(self) -> int | None: ...


class _Settings(Protocol):
    @property
    def max_restarts(self) -> int: ...


class JobView(Protocol):
    """The live values of one node's job that ``/status``, ``/readyz`` and ``/metrics`` show.

    Every member is read on the event loop and must not block. ``last_failure`` and
    ``last_hang`` are dataclass instances (or None), reported field for field.
    """

    node: str
    run_id: str
    name: str
    hang_count: int
    stacks_captured: int
    learned_heartbeat_timeout: float | None

    @property
    def config(self) -> _Settings: ...
    @property
    def state(self) -> WorkerState: ...
    @property
    def role(self) -> str: ...
    @property
    def round(self) -> int | None: ...
    @property
    def done(self) -> bool: ...
    @property
    def restart_count(self) -> int: ...
    @property
    def remaining_restarts(self) -> int: ...
    @property
    def last_failure(self) -> Any: ...
    @property
    def last_hang(self) -> Any: ...
    def workers(self) -> Sequence[WorkerView]: ...
    def heartbeat_age_ms(self) -> int | None: ...
    def idle_interpreters(self) -> tuple[int, int]: ...
    def checkpoint_status(self) -> dict[str, Any] | None: ...
    def node_health(self) -> dict[str, Any] | None: ...
    def unhealthy_reason(self) -> str | None: ...
    def goodput(self) -> dict[str, Any] | None: ...
    def straggler_status(self) -> dict[str, Any] | None: ...
