"""Every public module declares its surface in a tuple ``__all__`` whose names exist.

Modeled on anyio's ``tests/test_all_attributes.py``: private modules (``_x``) are
skipped; public modules must export exactly what they name.
"""

from __future__ import annotations

import importlib

import pytest
from _public import public_modules


@pytest.mark.parametrize("name", public_modules())
def test_module_declares_its_surface(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, tuple), f"{name}.__all__ must be a tuple"
    missing = [attr for attr in exported if not hasattr(module, attr)]
    assert not missing, f"{name}.__all__ names missing attributes: {missing}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"


def test_top_level_launch_names_come_from_the_launcher_package() -> None:
    # The launch API has one front door, ``aelastic`` (``aelastic.launcher`` exports only
    # torch's ``launch_agent`` and the errors). Its code is the package
    # `aelastic.launcher`, not `aelastic.launch`: a subpackage of that name would rebind
    # the function `aelastic.launch` on import.
    import types
    from pathlib import Path

    import aelastic.launcher
    from aelastic._lazy import type_checking_sources

    lazy = type_checking_sources(Path(aelastic.__file__).read_text(encoding="utf-8"))
    launch_api = {"Job", "LaunchConfig", "elastic_launch", "launch", "open_job", "run_job"}
    assert launch_api <= set(lazy)
    for name in launch_api:
        assert lazy[name].startswith(".launcher._"), (name, lazy[name])
        assert getattr(aelastic, name).__module__.startswith("aelastic.launcher."), name
        assert name not in aelastic.launcher.__all__, name
    assert not isinstance(aelastic.launch, types.ModuleType)
    assert callable(aelastic.launch)
