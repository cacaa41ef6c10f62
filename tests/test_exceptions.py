"""One exception tree: every public error derives from AelasticError, is defined in an
``_exceptions.py`` and names its public package as ``__module__`` (httpx, trio)."""

from __future__ import annotations

import importlib
import pickle
import pkgutil
import re

import pytest
from _public import public_modules

import aelastic
from aelastic import AelasticError, ConfigError


def _public_errors() -> list[tuple[str, str, type[BaseException]]]:
    found = []
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append((module_name, name, value))
    return found


_ERRORS = _public_errors()


def _defined_in_exceptions_modules() -> set[type]:
    classes: set[type] = set()
    for info in pkgutil.walk_packages(aelastic.__path__, "aelastic."):
        if info.name.endswith("._exceptions") or info.name == "aelastic._exceptions":
            classes.update(
                v for v in vars(importlib.import_module(info.name)).values() if isinstance(v, type)
            )
    classes.update(
        v
        for v in vars(importlib.import_module("aelastic._exceptions")).values()
        if isinstance(v, type)
    )
    return classes


_DEFINED_IN_EXCEPTIONS_MODULES = _defined_in_exceptions_modules()


def test_the_public_packages_export_errors() -> None:
    # guards the parametrisation below against finding nothing (32 public errors; the
    # rest are private, caught through their public base: issue 39 item 2)
    assert len({error for _, _, error in _ERRORS}) > 25


@pytest.mark.parametrize(
    ("module_name", "name", "error"), _ERRORS, ids=[f"{m}.{n}" for m, n, _ in _ERRORS]
)
def test_public_error_is_ours_and_shows_its_public_module(
    module_name: str, name: str, error: type[BaseException]
) -> None:
    assert issubclass(error, AelasticError), f"{module_name}.{name} must derive AelasticError"
    assert "._" not in error.__module__, f"{error} shows a private module"
    home = importlib.import_module(error.__module__)
    assert getattr(home, error.__name__) is error, f"{error.__module__} does not export it"
    assert error in _DEFINED_IN_EXCEPTIONS_MODULES, f"{error} is not defined in an _exceptions.py"


def test_every_error_of_an_exceptions_module_is_exported_where_it_says() -> None:
    for error in _DEFINED_IN_EXCEPTIONS_MODULES:
        if issubclass(error, BaseException) and error.__module__.startswith("aelastic"):
            home = importlib.import_module(error.__module__)
            assert getattr(home, error.__name__, None) is error, error


def test_config_errors_are_value_errors() -> None:
    # public or private (caught as ConfigError), each is a ValueError too
    config_errors = {
        error for error in _DEFINED_IN_EXCEPTIONS_MODULES if issubclass(error, ConfigError)
    }
    assert {e.__name__ for e in config_errors} >= {
        "AgentConfigError",
        "LaunchConfigError",
        "NodeHealthConfigError",
        "ProgressTimeoutError",
        "RendezvousConfigError",
        "StoreConfigError",
        "UsageError",
    }
    assert all(issubclass(error, ValueError) for error in config_errors)


def test_a_public_error_pickles_through_its_public_module() -> None:
    from aelastic.store import StoreTimeoutError

    error = pickle.loads(pickle.dumps(StoreTimeoutError("get timed out")))
    assert type(error) is StoreTimeoutError
    assert aelastic.ConfigError is ConfigError


@pytest.mark.parametrize(
    ("store_error", "expected"),
    [
        ("StoreTimeoutError", "RendezvousConnectionError"),
        ("StoreConnectionError", "RendezvousConnectionError"),
        ("StoreClosedError", "RendezvousConnectionError"),
        ("StoreLimitError", "RendezvousStateError"),
        ("EtcdCompactedError", "RendezvousStateError"),
    ],
)
def test_store_errors_become_the_same_rendezvous_error_for_every_backend(
    store_error: str, expected: str
) -> None:
    from aelastic import rendezvous
    from aelastic.rendezvous._exceptions import map_store_errors
    from aelastic.rendezvous.etcd._exceptions import EtcdCompactedError
    from aelastic.store import _exceptions as store_errors

    cls = (
        EtcdCompactedError
        if store_error == "EtcdCompactedError"
        else getattr(store_errors, store_error)
    )
    expected_error = getattr(rendezvous, expected)
    with (
        pytest.raises(expected_error, match=r"to add to 'k'") as caught,
        map_store_errors("add to 'k'"),
    ):
        raise cls("boom")
    assert isinstance(caught.value.__cause__, cls)


def test_map_store_errors_passes_through_what_the_caller_keeps() -> None:
    from aelastic.rendezvous._exceptions import map_store_errors
    from aelastic.store import StoreTimeoutError

    with pytest.raises(StoreTimeoutError), map_store_errors("read 'k'", keep=(StoreTimeoutError,)):
        raise StoreTimeoutError("late")


def _drawn_tree() -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """The drawing in ``aelastic/_exceptions.py``: name -> (drawn parent, bracketed bases)."""
    doc = importlib.import_module("aelastic._exceptions").__doc__ or ""
    drawing = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    drawn: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    parents: list[tuple[int, str]] = []  # the open branches: (indent, name)
    for line in drawing.splitlines():
        match = re.fullmatch(r"( *)(\w+)(?: \[([\w, ]+)\])?(?: +[\w.]+)? *", line)
        assert match, f"a line of the drawing does not parse: {line!r}"
        indent, name = len(match[1]), match[2]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        extra = tuple(b.strip() for b in match[3].split(",")) if match[3] else ()
        drawn[name] = (parents[-1][1] if parents else None, extra)
        parents.append((indent, name))
    return drawn


def test_the_drawn_tree_is_the_tree_of_the_code() -> None:
    drawn = _drawn_tree()
    errors = {  # public and private: the drawing shows the whole tree
        error.__name__: error
        for error in _DEFINED_IN_EXCEPTIONS_MODULES
        if issubclass(error, BaseException) and error.__module__.startswith("aelastic")
    }
    assert sorted(drawn) == sorted(errors), "the drawing and the errors differ"
    doc = importlib.import_module("aelastic._exceptions").__doc__ or ""
    marked = set(re.findall(r"^ +(\w+)(?: \[[\w, ]+\])? +private$", doc, re.M))
    private = {name for name, error in errors.items() if "._" in error.__module__}
    assert marked == private, "the drawing marks as private exactly the unexported errors"
    for name, (parent, extra) in drawn.items():
        bases = {base.__name__ for base in errors[name].__bases__}
        assert bases == {parent, *extra} - {None} | ({"Exception"} if parent is None else set())
