"""The checkpoint errors (no torch, no anyio: the agent and the workers share them)."""

from __future__ import annotations

from .._exceptions import AelasticError, show_public_module

__all__ = ("CheckpointError",)


class CheckpointError(AelasticError):
    """A checkpoint could not be saved or loaded; the message names the cause and the fix.

    Raised before anything of the new step is visible: the previous step stays intact.
    """


show_public_module(__name__, globals())
