"""Every name a subpackage exports has a user outside that subpackage.

A name in ``aelastic.<package>.__all__`` must be used by something that is not the
package itself: another aelastic package, a test, a benchmark, an example, the README or
``docs/`` (as ``aelastic.<package>.<name>``, ``<package>.<name>`` or ``from aelastic.<package>
import <name>``), or be part of the signature of such a used name (a parameter, return,
field or attribute type a caller needs to name). Error classes are public by nature
(callers catch them; ``tests/test_exceptions.py`` checks that each is exported from its
package). The few that have no user yet but are
public on purpose (torch's names, plugin hooks) are listed in :data:`PUBLIC_WITHOUT_USER`
with the reason. A name only its own package uses belongs in its private module.

Sources are read with :mod:`ast`; the packages are imported to read their signatures.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aelastic

ROOT = Path(aelastic.__file__).parent
REPO = ROOT.parent

#: (package, name) -> why it is exported although nothing outside the package uses it.
PUBLIC_WITHOUT_USER: dict[tuple[str, str], str] = {
    ("aelastic.agent", "DEFAULT_ROLE"): "torch's name (agent.server.api)",
    ("aelastic.agent", "ElasticAgent"): "torch's name: the agent interface",
    ("aelastic.agent", "SimpleElasticAgent"): "torch's name: the agent base to subclass",
    ("aelastic.agent", "Worker"): "torch's name (agent.server.api)",
    ("aelastic.errors", "error_file_data"): "torch's name (errors.error_handler)",
    ("aelastic.launcher", "launch_agent"): "torch's name (launcher.api)",
    ("aelastic.rendezvous", "rendezvous_handler_registry"): "torch's name (rendezvous)",
    ("aelastic.rendezvous", "RendezvousClosedException"): "torch's old name of the error",
    ("aelastic.rendezvous", "RendezvousTimeoutException"): "torch's old name of the error",
    ("aelastic.rendezvous", "RendezvousNonRetryableError"): "torch's name (rendezvous.api)",
    ("aelastic.rendezvous", "ENTRY_POINT_GROUP"): "plugins name it in their packaging",
    ("aelastic.nodes", "HealthCheck"): "plugin hook: the type of a health check",
    ("aelastic.nodes", "CheckResult"): "plugin hook: what a health check returns",
}


def _packages() -> dict[str, Path]:
    """Every subpackage with an ``__all__``: its name -> its directory."""
    found = {}
    for init in sorted(ROOT.rglob("__init__.py")):
        if init.parent == ROOT:
            continue
        name = ".".join(["aelastic", *init.parent.relative_to(ROOT).parts])
        found[name] = init.parent
    return found


PACKAGES = _packages()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _uses_in_python(path: Path) -> Iterator[tuple[str, str]]:
    """(package, name) for each exported-looking name ``path`` takes from a package:
    ``from <package> import name``, ``<package alias>.name``, and the text
    ``"aelastic.<package>.name"`` in a string."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                if source in PACKAGES:
                    yield source, alias.name
                if f"{source}.{alias.name}" in PACKAGES:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in PACKAGES:
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            source = aliases.get(owner, owner)
            if source in PACKAGES:
                yield source, node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from _uses_in_text(node.value, short=False)


def _uses_in_text(text: str, *, short: bool) -> Iterator[tuple[str, str]]:
    for dotted, name in re.findall(r"(aelastic(?:\.\w+)+)\.(\w+)", text):
        yield dotted, name
    for source, names in re.findall(r"from (aelastic[\w.]*) import \(?([\w, \n]+)", text):
        for name in re.findall(r"\w+", names):
            yield source, name
    if short:  # prose: ``metrics.prof``, ``rendezvous.register``
        for package in PACKAGES:
            leaf = package.rpartition(".")[2]
            for name in re.findall(rf"(?<![\w.]){leaf}\.(\w+)", text):
                yield package, name


def _outside_uses() -> set[tuple[str, str]]:
    used: set[tuple[str, str]] = set()
    roots = [ROOT, REPO / "tests", REPO / "benchmarks", REPO / "examples"]
    for path in (p for root in roots for p in sorted(root.rglob("*.py"))):
        inside = {pkg for pkg, directory in PACKAGES.items() if directory in path.parents}
        for package, name in _uses_in_python(path):
            if package not in inside and not any(p.startswith(package + ".") for p in inside):
                used.add((package, name))
    docs = sorted((REPO / "docs").glob("*.md"))
    for doc in (REPO / "README.md", REPO / "examples" / "README.md", *docs):
        if doc.exists():
            used.update(_uses_in_text(doc.read_text(), short=True))
    return used


def _signature_names(obj: Any) -> set[str]:
    """The identifiers in the annotations a caller of ``obj`` meets: a function's
    parameters and return; a class's fields, constructor, public methods and properties."""
    texts: list[str] = []

    def add_callable(fn: Any) -> None:
        for annotation in getattr(fn, "__annotations__", {}).values():
            texts.append(str(annotation))

    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if klass.__module__.startswith("aelastic"):
                texts.extend(str(a) for a in vars(klass).get("__annotations__", {}).values())
                for attr, member in vars(klass).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(member, property):
                        add_callable(member.fget)
                    elif isinstance(member, (staticmethod, classmethod)):
                        add_callable(member.__func__)
                    elif callable(member):
                        add_callable(member)
    elif callable(obj):
        add_callable(obj)
    return {word for text in texts for word in re.findall(r"[A-Za-z_]\w*", text)}


def _unused_exports() -> list[str]:
    exports = {
        package: tuple(importlib.import_module(package).__all__)
        for package in PACKAGES
        if hasattr(importlib.import_module(package), "__all__")
    }
    reached = {
        (package, name)
        for package, name in _outside_uses() | set(PUBLIC_WITHOUT_USER)
        if name in exports.get(package, ())
    }
    frontier = list(reached)
    while frontier:  # the types in a used name's signature are used too
        package, name = frontier.pop()
        words = _signature_names(getattr(importlib.import_module(package), name))
        for word in words & set(exports[package]):
            if (package, word) not in reached:
                reached.add((package, word))
                frontier.append((package, word))
    return sorted(
        f"{package}.{name}"
        for package, names in exports.items()
        for name in names
        if (package, name) not in reached and not _is_error(package, name)
    )


def _is_error(package: str, name: str) -> bool:
    obj = getattr(importlib.import_module(package), name)
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def test_every_export_has_a_user_outside_its_package() -> None:
    unused = _unused_exports()
    assert not unused, (
        "exported, but used only inside their own package: take them out of __all__ (and "
        "the package's imports), or add them to PUBLIC_WITHOUT_USER with the reason:\n"
        + "\n".join(unused)
    )


def test_the_allowlist_names_exports() -> None:
    stale = [
        f"{package}.{name}"
        for package, name in PUBLIC_WITHOUT_USER
        if name not in importlib.import_module(package).__all__
    ]
    assert not stale, f"no longer exported, so remove from PUBLIC_WITHOUT_USER: {stale}"


def test_the_scan_sees_what_it_judges() -> None:
    # Guards against a test that passes because it reads nothing: an attribute use
    # (``metrics.prof`` in the agent), a relative import from another package, an
    # absolute one in a test, and a type reached only through a signature.
    used = _outside_uses()
    assert ("aelastic.metrics", "prof") in used
    assert ("aelastic.store", "StoreError") in used
    assert ("aelastic.rendezvous", "RendezvousParameters") in used
    assert "Liveness" in _signature_names(aelastic.rendezvous.DynamicRendezvousHandler)
