"""``aelastic._entry_points``: the fast "no entry points" answer agrees with importlib.metadata."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aelastic._entry_points import entry_points_of
from aelastic.nodes._checks import entry_point_checks

GROUP = "aelastic.test_group_ep"


def _install(site: Path, name: str, text: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(text)


def test_a_declared_entry_point_is_found_and_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ep_plugin_mod.py").write_text("def check():\n    return True, 'fine'\n")
    _install(tmp_path, "ep_plugin", f"[{GROUP}]\nmine = ep_plugin_mod:check\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = entry_points_of(GROUP)
    assert [(ep.name, ep.value) for ep in found] == [("mine", "ep_plugin_mod:check")]
    assert found[0].load()() == (True, "fine")
    assert [check.name for check in entry_point_checks(GROUP)] == [f"{GROUP}:mine"]


def test_an_undeclared_group_is_empty_without_importing_importlib_metadata(
    tmp_path: Path,
) -> None:
    _install(tmp_path, "other_plugin", "[some.other.group]\nx = os:getcwd\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from aelastic._entry_points import entry_points_of
        assert entry_points_of({GROUP!r}) == []
        assert "importlib.metadata" not in sys.modules, "imported importlib.metadata"
        from importlib.metadata import entry_points
        assert list(entry_points(group={GROUP!r})) == []
        assert [ep.name for ep in entry_points_of("some.other.group")] == ["x"]
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_archive_on_the_path_defers_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zipfile

    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\n")
        zf.writestr("zipped-1.0.dist-info/entry_points.txt", f"[{GROUP}]\nz = os:getcwd\n")
    monkeypatch.syspath_prepend(str(archive))
    assert [ep.name for ep in entry_points_of(GROUP)] == ["z"]
