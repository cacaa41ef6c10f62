"""aelastic's public modules: ``aelastic`` and each module with no ``_private`` part in
its path (the export, exception and API tests walk the same list)."""

from __future__ import annotations

import pkgutil

import aelastic


def public_modules() -> list[str]:
    """Names of the public modules, ``aelastic`` first; ``aelastic.__main__`` is left out
    (importing it runs the command line)."""
    names = ["aelastic"]
    for info in pkgutil.walk_packages(aelastic.__path__, "aelastic."):
        if "._" not in info.name and info.name != "aelastic.__main__":
            names.append(info.name)
    return names
