"""Entry of ``python -m aelastic status`` (see :mod:`aelastic.jobview._cli`)."""

from ._cli import status_main as main

__all__ = ("main",)
