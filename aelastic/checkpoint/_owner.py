"""Checkpoint memory directories with an owner (``aelastic_ckpt_<run>_*`` in the memory root).

The mechanism (a ``flock`` held on ``<dir>/.owner`` while the agent lives, so the next
agent frees what a killed one left) is :mod:`aelastic._owned_dirs`, shared with the
progress files' directories; this module names the checkpoint ones.
"""

from __future__ import annotations

from .. import _owned_dirs
from .._owned_dirs import release_if_empty

__all__ = ("PREFIX", "claim", "release_if_empty", "sweep_abandoned")

PREFIX = "aelastic_ckpt_"


def claim(root: str, label: str) -> tuple[str, int]:
    """Create this agent's directory ``aelastic_ckpt_<label>_*`` in ``root``; ``(path, fd
    of the held lock)``. Blocking (a few system calls)."""
    return _owned_dirs.claim(root, f"{PREFIX}{label}_")


def sweep_abandoned(root: str) -> list[str]:
    """Remove the checkpoint directories in ``root`` whose agent died; their paths. Blocking."""
    return _owned_dirs.sweep_abandoned(root, PREFIX)
