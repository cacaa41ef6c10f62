"""The package's layers, as stated in ``aelastic/__init__.py``, hold for every import.

Every ``import`` and ``from ... import`` of every module is read with :mod:`ast`,
wherever it is (module level, inside a function, under ``if TYPE_CHECKING:``), and
resolved to the modules it names. Two rules:

* a package imports only from itself and from lower layers;
* no two modules import each other, directly or through others (a cycle).

Which module of a lower package it imports is free: aelastic is the one package users
see, so its private modules import each other across subpackages (anyio's shape), and a
subpackage's ``__init__`` exports only what users need (``tests/test_exports.py``).

Nothing is imported or run: the test reads source files.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aelastic

ROOT = Path(aelastic.__file__).parent

#: Known violations, each with its reason; the test fails when one of them is fixed (so
#: the list only shrinks) as well as on any new one.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def _layers() -> dict[str, int]:
    """Top-level name (package or base module) -> layer number, from the docstring."""
    doc = aelastic.__doc__ or ""
    layers: dict[str, int] = {}
    for number, names in re.findall(r"^\s+(\d+)\. (?:[a-z -]+: )?([\w ]+)$", doc, re.M):
        for name in names.split():
            layers[name] = int(number)
    return layers


LAYERS = _layers()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module
    line: int


def _module_name(path: Path) -> str:
    parts = ["aelastic", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(module: str, path: Path) -> Iterator[Import]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("aelastic"):
                    yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("aelastic"):
                continue
            yield Import(module, target, node.lineno)
            for alias in node.names:  # `from pkg import _submodule` names a module too
                if f"{target}.{alias.name}" in MODULES:
                    yield Import(module, f"{target}.{alias.name}", node.lineno)


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _top(module: str) -> str:
    """``aelastic.store._interface`` -> ``store``; the package itself -> ``""``."""
    return module.split(".")[1] if "." in module else ""


def _where(imp: Import) -> str:
    return f"{MODULES[imp.source].relative_to(ROOT.parent)}:{imp.line}: {imp.target}"


def test_every_package_has_a_layer() -> None:
    tops = {_top(m) for m in MODULES} - {""}
    missing = sorted(tops - LAYERS.keys())
    assert not missing, (
        f"{missing}: not in the layer list of aelastic/__init__.py's docstring; add each "
        "to the lowest layer that holds everything it imports"
    )


def test_imports_only_look_down() -> None:
    upward = [
        f"{_where(imp)} (layer {LAYERS[_top(imp.source)]} imports layer {LAYERS[_top(imp.target)]})"
        for imp in IMPORTS
        if _top(imp.source)
        and _top(imp.target)
        and _top(imp.source) != _top(imp.target)
        and LAYERS[_top(imp.target)] >= LAYERS[_top(imp.source)]
    ]
    assert not upward, "imports that do not go to a lower layer:\n" + "\n".join(upward)


def _cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm).

    A module's import of its own package's ``__init__`` is left out: the package is
    already loaded (partly) when its modules run, and lazy ``__init__`` files name
    their modules only as strings.
    """
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if imp.target in MODULES and not imp.source.startswith(imp.target + "."):
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for node in graph:
        if node not in index:
            visit(node)
    return out


def test_no_import_cycles() -> None:
    found = _cycles()
    new = [sorted(c) for c in found if c not in ALLOWED_CYCLES]
    assert not new, "modules that import each other (move what they share down):\n" + "\n".join(
        " <-> ".join(c) for c in new
    )
    fixed = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert not fixed, f"cycles broken, so remove them from ALLOWED_CYCLES: {fixed}"


def test_the_checks_see_what_they_judge() -> None:
    # The parser finds the imports these rules are about (a guard against a test that
    # passes because it reads nothing): a TYPE_CHECKING-guarded one, a function-level
    # one, a relative one two levels up.
    pairs = {(imp.source, imp.target) for imp in IMPORTS}
    assert ("aelastic.launcher._build", "aelastic.rendezvous") in pairs  # TYPE_CHECKING
    assert ("aelastic.launcher._job", "aelastic.events") in pairs  # in a function
    assert ("aelastic.rendezvous.etcd._store", "aelastic.store") in pairs  # from ...store
    assert LAYERS["store"] < LAYERS["events"] < LAYERS["agent"] < LAYERS["launcher"]
