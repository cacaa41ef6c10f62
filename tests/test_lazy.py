"""Lazy exports are declared once, in the package's ``TYPE_CHECKING`` block."""

from __future__ import annotations

from pathlib import Path

import pytest

from aelastic._lazy import lazy_exports, type_checking_sources

_INIT = """
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # a comment
    from ._a import A as A
    from .sub._b import b as b

__all__ = ("A", "b")
"""


def test_the_type_checking_block_is_the_declaration() -> None:
    assert type_checking_sources(_INIT) == {"A": "._a", "b": ".sub._b"}


def test_an_import_it_cannot_read_is_an_error() -> None:
    with pytest.raises(ImportError, match="not of the form"):
        type_checking_sources("if TYPE_CHECKING:\n    from ._a import (A as A)\n")


def test_a_lazy_name_missing_from_all_is_an_error(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text(_INIT.replace('("A", "b")', '("A",)'))
    with pytest.raises(ImportError, match=r"\['b'\] are missing from __all__"):
        lazy_exports("pkg", {"__file__": str(init), "__all__": ("A",)})
