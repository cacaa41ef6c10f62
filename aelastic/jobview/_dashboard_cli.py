"""Entry of ``python -m aelastic dashboard`` (see :mod:`aelastic.jobview._cli`)."""

from ._cli import dashboard_main as main

__all__ = ("main",)
