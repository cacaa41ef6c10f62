"""The ``aelastic run`` option table: the row format and what a group's checks read.

Each group of ``run`` flags (hang detection, checkpoints, node health) keeps its rows
(:data:`Option`) and its checks in a module of its own (a feature's settings module, or
one beside the launcher's parser); the argument parser appends the rows to its table and
hands each group's ``config_fields`` the parsed :class:`OptionValues`. In the base layer
so a feature's settings module can own its flags without importing the launcher.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ("Option", "OptionValues")

#: ``(flags, dest, kind, default, help)``: one row of the launcher's option table.
Option = tuple[tuple[str, ...], str, str, Any, str]


class OptionValues(Protocol):
    """The parsed flags, each read with its check (the parser's values object)."""

    def source(self, dest: str) -> str: ...
    def given(self, dest: str) -> bool: ...
    def str_(self, dest: str) -> Any: ...
    def flag(self, dest: str) -> bool: ...
    def int_(self, dest: str, *, minimum: int | None = None) -> int | None: ...
    def float_(self, dest: str, *, minimum: float, strict: bool = False) -> float | None: ...
    def env(self, name: str) -> str | None:
        """Variable ``name`` of the environment handed to the parser (not ``os.environ``)."""
        ...
