"""Entry points of one group, without importing ``importlib.metadata`` when there are none.

``importlib.metadata.entry_points(group=...)`` costs ~20 ms on every call from a fresh
interpreter (its import pulls ``email``, ``zipfile``, ``csv``, ``pathlib``; then it parses
every installed distribution's metadata), paid by each ``aelastic run`` for the
node-health plugin group that is almost always empty. :func:`entry_points_of` first
reads only the ``entry_points.txt`` files on ``sys.path`` (a directory listing and a few
small reads) and answers "none" when no file names the group; otherwise, and whenever
the search path holds something this scan does not understand (an archive, an egg, a
custom metadata finder), it asks ``importlib.metadata``, so the answer is always its.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ("entry_points_of",)

_METADATA_DIRS = (".dist-info", ".egg-info")


def entry_points_of(group: str) -> list[Any]:
    """``importlib.metadata``'s entry points of ``group`` (``[]`` fast when none can exist).

    Blocking file reads bounded by the installed distributions (a few ms); never raises
    for an unreadable path entry (it is skipped, as ``importlib.metadata`` skips it).
    """
    if not _may_declare(group):
        return []
    from importlib.metadata import entry_points

    return list(entry_points(group=group))


def _may_declare(group: str) -> bool:
    """False only when no distribution ``importlib.metadata`` could find names ``group``."""
    from importlib.machinery import PathFinder

    if any(
        hasattr(finder, "find_distributions") and finder is not PathFinder
        for finder in sys.meta_path
    ):
        return True  # a finder this scan does not know: let importlib.metadata answer
    return any(_entry_may_declare(entry or ".", group) for entry in sys.path)


def _entry_may_declare(entry: str, group: str) -> bool:
    if not os.path.isdir(entry):
        return os.path.exists(entry)  # an archive on the path: not scanned here
    try:
        names = os.listdir(entry)
    except OSError:
        return False
    for name in names:
        lower = name.lower()
        if lower.endswith(".egg"):
            return True  # eggs keep their metadata elsewhere: not scanned here
        if not lower.endswith(_METADATA_DIRS):
            continue
        try:
            with open(os.path.join(entry, name, "entry_points.txt"), "rb") as f:
                if group.encode() in f.read():
                    return True
        except OSError:  # no entry points (or a file-form egg-info)
            continue
    return False
