"""``RoundGate``: what the agent asks of a node gate before and after each round.

A structural type, so the agent depends on nothing above it: :class:`aelastic.nodes._gate.NodeGate`
(health checks, exclusion after repeated failures) is one, built by the launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..rendezvous import RendezvousHandler
    from ._policy import Decision

__all__ = ("Emit", "RoundGate")

#: ``emit(name, metadata)``: record an event of the agent.
Emit = Callable[[str, Mapping[str, Any]], None]


class RoundGate(Protocol):
    """Keeps this node out of rounds it should not join (``aelastic.nodes._gate.NodeGate``)."""

    async def admit(self, handler: RendezvousHandler, emit: Emit) -> None:
        """Return once this node may join the next round (raises when the job ended)."""

    async def review(
        self,
        decision: Decision,
        remaining_restarts: int,
        why: str,
        handler: RendezvousHandler,
        emit: Emit,
    ) -> Decision:
        """The decision after a failed round of this node, possibly turned into a step-out."""

    async def notes(self, handler: RendezvousHandler) -> list[str]:
        """Lines about the job for the failure summary (the nodes excluded so far)."""
