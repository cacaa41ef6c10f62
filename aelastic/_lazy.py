"""Lazy public names for a package (PEP 562), declared once: in its ``TYPE_CHECKING`` block.

A package whose submodules are costly to import (anyio, the agent) lists its lazy names as
``from ._module import Name as Name`` lines under ``if TYPE_CHECKING:``, where mypy and
editors see them, and calls :func:`lazy_exports`. That block is the one declaration: it is
read from the package's source (as anyio derives its lazy map from the same block), so a
name cannot be typed in one place and missing from the other. A submodule is imported when
one of its names is first looked up, and the value is cached in the package's namespace.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ("lazy_exports", "type_checking_sources")


def type_checking_sources(source: str) -> dict[str, str]:
    """``{name: module}`` for every ``from module import name as name`` line of the
    module-level ``if TYPE_CHECKING:`` blocks of ``source`` (a relative module keeps its
    leading dots). One import per line; any other import there raises ImportError, so a
    declaration is never silently skipped. Read line by line (no ``ast``: ``aelastic run``
    imports its packages before the workers' pre-start, and every millisecond shows)."""
    sources: dict[str, str] = {}
    inside = False
    for line in source.splitlines():
        if line.startswith("if TYPE_CHECKING:"):
            inside = True
            continue
        if inside and line and not line[0].isspace():
            inside = False
        if not inside or not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _IMPORT.match(line)
        if match is None:
            raise ImportError(f"lazy export line not of the form 'from .m import N as N': {line!r}")
        sources[match["name"]] = match["module"]
    return sources


_IMPORT = re.compile(r"\s+from\s+(?P<module>\.*[\w.]*)\s+import\s+\w+\s+as\s+(?P<name>\w+)\s*$")


def lazy_exports(
    package: str, namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__init__`` passes ``__name__`` and
    ``globals()``): the names of its ``TYPE_CHECKING`` imports load on first use, ``dir()``
    lists them with ``__all__``. An unknown name raises AttributeError as a module would;
    a lazy name missing from ``__all__`` raises ImportError at once (a declaration slip)."""
    sources = type_checking_sources(Path(namespace["__file__"]).read_text(encoding="utf-8"))
    names: tuple[str, ...] = namespace.get("__all__", ())
    unlisted = sorted(set(sources) - set(names))
    if unlisted:
        raise ImportError(f"{package}: lazy names {unlisted} are missing from __all__")

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
