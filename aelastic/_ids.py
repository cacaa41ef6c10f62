"""Random identifiers without the :mod:`uuid` module (which imports :mod:`platform`, ~2 ms)."""

from __future__ import annotations

import os

__all__ = ("random_uuid4",)


def random_uuid4() -> str:
    """A random RFC 4122 version-4 UUID, formatted as ``str(uuid.uuid4())`` is."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
