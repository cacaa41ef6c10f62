"""Lazy public names for a package (PEP 562): one definition for every package that uses it.

A package whose submodules are costly to import (anyio, the agent) names its public API in
``__all__`` and maps each name to the module that defines it; the module is imported when
the name is first looked up, and the value is cached in the package's namespace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], sources: Mapping[str, str], names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``sources`` maps a public name to the
    (relative or absolute) module that defines it; ``names`` are what ``dir()`` lists besides
    the namespace. An unknown name raises AttributeError as a module would."""

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
