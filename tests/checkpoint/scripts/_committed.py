"""What the scripts here read back: a checkpoint directory's committed files."""

from __future__ import annotations

import os

from aelastic import checkpoint


def committed(root: str) -> list[str]:
    """The committed files under ``root``, sorted, once the save in flight is done (hidden
    entries, like a rank's spare buffer, are the saver's)."""
    checkpoint.wait()
    return sorted(
        os.path.join(d, f)
        for d in os.listdir(root)
        if not d.startswith(".")
        for f in os.listdir(os.path.join(root, d))
    )
