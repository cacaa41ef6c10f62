"""``dataclass``: the standard ``@dataclass``, without compiling code when a class is made.

In CPython 3.10-3.12, ``@dataclass`` writes the source of ``__init__``, ``__repr__``,
``__eq__``, ``__hash__`` and, when frozen, ``__setattr__`` and ``__delattr__`` for each
class and compiles each one with ``exec``: about 1 ms per class. A launch imports some
fifty of them before its first worker starts, so this alone cost 25-35 ms of every
``aelastic run`` (``benchmarks/launch_overhead.py``).

This ``dataclass`` takes the forms aelastic uses (``@dataclass`` and ``@dataclass(frozen=True)``,
``init=False``) and makes a real dataclass: ``dataclasses.fields``, ``replace``,
``asdict``, ``is_dataclass``, pickling and ``__match_args__`` work as for ``@dataclass``,
and type checkers see ``dataclasses.dataclass`` itself. Fields are processed by
``dataclasses`` (``field()``, ``default_factory``, ``init=False``, ``repr=False``,
``compare=False`` and ``hash=`` mean what they mean there); the methods are shared
functions that read the class's fields instead of code compiled per class. They behave as
the generated ones do, including their errors (``TypeError`` for a missing, unexpected or
repeated argument; :class:`dataclasses.FrozenInstanceError` on assignment to a frozen
instance). The cost moves to instantiation (about 1-2 us more per object), which suits
the classes here: configuration, events and per-round state, not per-request objects.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import itertools
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ("dataclass",)

_T = TypeVar("_T")
_MISSING: Any = dataclasses.MISSING

if TYPE_CHECKING:
    from dataclasses import dataclass
else:

    def dataclass(
        cls: type[_T] | None = None, /, *, frozen: bool = False, init: bool = True
    ) -> Any:
        """``@dataclass`` with the same arguments (``frozen``, ``init``); see the module doc."""

        def wrap(cls: type[_T]) -> type[_T]:
            return _make_dataclass(cls, frozen=frozen, init=init)

        return wrap if cls is None else wrap(cls)


def _make_dataclass(cls: type[_T], *, frozen: bool, init: bool) -> type[_T]:
    # aelastic's dataclasses have no dataclass bases (a frozen base would need the checks
    # @dataclass makes between bases and subclasses); refused rather than half supported.
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            raise TypeError(f"{cls.__qualname__}: inheriting dataclass {base!r} is not supported")
    class_hash = cls.__dict__.get("__hash__", _MISSING)
    explicit_hash = not (
        class_hash is _MISSING or (class_hash is None and "__eq__" in cls.__dict__)
    )
    documented = bool(cls.__dict__.get("__doc__"))
    if not documented:
        # @dataclass writes an undocumented class's docstring from inspect.signature, which
        # for this still init-less class parses object's text signature with ast.parse: on
        # CPython 3.11.7 two threads building ASTs at once can fail with "SystemError: AST
        # constructor recursion depth mismatch" (cpython#106905), and the launcher imports
        # modules in a worker thread while its loop runs (launcher/_preimport.py). So no
        # AST is built here; _Doc below gives the docstring @dataclass would, when asked.
        cls.__doc__ = cls.__name__
    # Fields, defaults and the class attributes as @dataclass sets them; no method made.
    dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init, params.repr, params.eq, params.frozen = init, True, True, frozen
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    _refuse_unsupported(cls, fields)
    if init:
        _set_new(cls, "__init__", _init_method(cls, fields, frozen))
        # what inspect.signature and help() show, built from the fields when asked
        cls.__signature__ = _Signature()  # type: ignore[attr-defined]
    if not documented:
        cls.__doc__ = _Doc()  # type: ignore[assignment]
    _set_new(cls, "__repr__", _repr_method(fields))
    _set_new(cls, "__eq__", _eq_method(fields))
    if frozen:
        names = frozenset(f.name for f in fields)
        for name, method in _frozen_methods(cls, names).items():
            if name in cls.__dict__:
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
            _set_new(cls, name, method)
    if not explicit_hash:
        if frozen:
            hash_method = _hash_method(fields)
            hash_method.__qualname__ = f"{cls.__qualname__}.__hash__"
            hash_method.__module__ = cls.__module__
            cls.__hash__ = hash_method  # type: ignore[method-assign,assignment]
        else:
            cls.__hash__ = None  # type: ignore[assignment]
    return cls


def _set_new(cls: type, name: str, method: Callable[..., Any]) -> None:
    if name not in cls.__dict__:
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        method.__module__ = cls.__module__
        setattr(cls, name, method)


def _refuse_unsupported(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """``InitVar`` pseudo-fields and keyword-only fields (``kw_only``, ``KW_ONLY``) would
    need more than the shared ``__init__`` does: refused, not half supported."""
    initvar = getattr(dataclasses, "_FIELD_INITVAR", None)
    for f in cls.__dataclass_fields__.values():  # type: ignore[attr-defined]
        if initvar is not None and getattr(f, "_field_type", None) is initvar:
            raise TypeError(f"{cls.__qualname__}.{f.name}: InitVar is not supported here")
    for f in fields:
        if getattr(f, "kw_only", False) is True:
            raise TypeError(f"{cls.__qualname__}.{f.name}: keyword-only fields are not supported")


class _Signature:
    """``cls.__signature__``, made from the fields on first use (0.1-0.2 ms, not at import)."""

    def __get__(self, obj: object, owner: type) -> inspect.Signature:
        P = inspect.Parameter
        parameters = []
        for f in dataclasses.fields(owner):
            if not f.init:
                continue
            kind, default = _default_of(f)
            shown = default if kind is _Default.VALUE else P.empty
            if kind is _Default.FACTORY:
                shown = _Factory(default)
            parameters.append(P(f.name, P.POSITIONAL_OR_KEYWORD, default=shown, annotation=f.type))
        return inspect.Signature(parameters, return_annotation=None)


class _Factory:
    """How a signature shows a ``default_factory``: ``<factory>``, as ``@dataclass`` does."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def __repr__(self) -> str:
        return "<factory>"


class _Doc:
    """The docstring ``@dataclass`` gives a class without one: its name and signature."""

    def __get__(self, obj: object, owner: type) -> str:
        text = str(inspect.signature(owner)).replace(" -> None", "")
        return owner.__name__ + text


def _init_method(
    cls: type, fields: tuple[dataclasses.Field[Any], ...], frozen: bool
) -> Callable[..., None]:
    params = [(f.name, *_default_of(f)) for f in fields if f.init]
    names = [name for name, _, _ in params]
    position_of = {name: position for position, name in enumerate(names)}
    # Outside __init__, only a default_factory is set per instance; a plain default stays
    # on the class, where @dataclass leaves it too.
    later: list[tuple[str, Callable[[], Any]]] = [
        (f.name, f.default_factory)  # type: ignore[misc]
        for f in fields
        if not f.init and f.default_factory is not _MISSING
    ]
    post_init = hasattr(cls, "__post_init__")
    assign = object.__setattr__ if frozen else setattr
    prefix = f"{cls.__qualname__}.__init__()"
    # the wording of Python's own TypeError for too many positional arguments
    required = sum(kind is _Default.NONE for _, kind, _ in params) + 1
    most = len(params) + 1
    takes = f"from {required} to {most}" if required < most else str(most)
    takes += " positional argument" if most == 1 else " positional arguments"
    # the order ``@dataclass`` enforces: no field without a default after one with
    for (_, before, _), (name, after, _) in itertools.pairwise(params):
        if before is not _Default.NONE and after is _Default.NONE:
            raise TypeError(f"non-default argument {name!r} follows default argument")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = len(args)
        if given > len(names):
            raise TypeError(f"{prefix} takes {takes} but {given + 1} were given")
        for key in kwargs:  # in the call's order, as Python reports the first
            position = position_of.get(key)
            if position is None:
                raise TypeError(f"{prefix} got an unexpected keyword argument {key!r}")
            if position < given:
                raise TypeError(f"{prefix} got multiple values for argument {key!r}")
        missing = []
        for position, (name, kind, default) in enumerate(params):
            if position < given:
                value = args[position]
            elif name in kwargs:
                value = kwargs[name]
            elif kind is _Default.VALUE:
                value = default
            elif kind is _Default.FACTORY:
                value = default()
            else:
                missing.append(name)
                continue
            assign(self, name, value)
        if missing:
            raise TypeError(f"{prefix} missing {_missing_text(missing)}")
        for name, factory in later:
            assign(self, name, factory())
        if post_init:
            self.__post_init__()

    return __init__


def _missing_text(names: list[str]) -> str:
    """Python's wording: ``1 required positional argument: 'a'``, ``2 ...: 'a' and 'b'``,
    ``3 ...: 'a', 'b', and 'c'``."""
    quoted = [repr(name) for name in names]
    if len(quoted) == 1:
        return f"1 required positional argument: {quoted[0]}"
    listed = (
        " and ".join(quoted) if len(quoted) == 2 else ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    )
    return f"{len(quoted)} required positional arguments: {listed}"


class _Default(enum.Enum):
    """What a field holds when ``__init__`` is not given it."""

    NONE = "required"
    VALUE = "default"
    FACTORY = "default_factory"


def _default_of(f: dataclasses.Field[Any]) -> tuple[_Default, Any]:
    if f.default is not _MISSING:
        return _Default.VALUE, f.default
    if f.default_factory is not _MISSING:
        return _Default.FACTORY, f.default_factory
    return _Default.NONE, None


def _repr_method(fields: tuple[dataclasses.Field[Any], ...]) -> Callable[[Any], str]:
    shown = [f.name for f in fields if f.repr]

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inner})"

    return __repr__


def _eq_method(fields: tuple[dataclasses.Field[Any], ...]) -> Callable[[Any, Any], Any]:
    compared = [f.name for f in fields if f.compare]

    def __eq__(self: Any, other: Any) -> Any:
        # as the generated one: tuples, so that an element identical to itself is equal
        if other.__class__ is not self.__class__:
            return NotImplemented
        mine = tuple([getattr(self, name) for name in compared])
        return mine == tuple([getattr(other, name) for name in compared])

    return __eq__


def _hash_method(fields: tuple[dataclasses.Field[Any], ...]) -> Callable[[Any], int]:
    hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]

    def __hash__(self: Any) -> int:
        return hash(tuple([getattr(self, name) for name in hashed]))

    return __hash__


def _frozen_methods(cls: type, names: frozenset[str]) -> dict[str, Callable[..., None]]:
    base: Any = super  # typed loosely: mypy cannot see that ``cls`` is the instance's class

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        base(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        base(cls, self).__delattr__(name)

    return {"__setattr__": __setattr__, "__delattr__": __delattr__}
