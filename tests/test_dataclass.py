"""``aelastic._dataclass.dataclass`` behaves as the standard ``@dataclass`` on the same class.

Each case builds one class body twice, once with each decorator, and compares what the
two do: construction, defaults, errors, ``repr``, equality, hashing, freezing,
``dataclasses`` helpers and pickling.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from aelastic._dataclass import dataclass as fast_dataclass

Decorator = Callable[..., Any]
BOTH = pytest.mark.parametrize("deco", [dataclasses.dataclass, fast_dataclass], ids=["std", "fast"])


def _point(deco: Decorator, **options: Any) -> type:
    @deco(**options)
    class Point:
        x: int
        y: int = 0
        tags: list[str] = dataclasses.field(default_factory=list)
        note: str = dataclasses.field(default="", compare=False, repr=False)
        seen: int = dataclasses.field(init=False, default=7)

    return Point


def _pair(**options: Any) -> tuple[type, type]:
    return _point(dataclasses.dataclass, **options), _point(fast_dataclass, **options)


# Pickling needs module-level classes.
@fast_dataclass(frozen=True)
class Frozen:
    name: str
    values: tuple[int, ...] = ()


@fast_dataclass
class Mutable:
    name: str
    values: list[int] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize("frozen", [False, True])
def test_construction_defaults_and_repr_match(frozen: bool) -> None:
    std, fast = _pair(frozen=frozen)
    for args, kwargs in [
        ((1,), {}),
        ((1, 2), {}),
        ((), {"x": 3, "tags": ["a"]}),
        ((1,), {"note": "n"}),
    ]:
        a, b = std(*args, **kwargs), fast(*args, **kwargs)
        assert repr(a) == repr(b)
        assert dataclasses.asdict(a) == dataclasses.asdict(b)
        assert dataclasses.astuple(a) == dataclasses.astuple(b)
        assert b.seen == 7
    # a default factory runs per instance
    assert fast(1).tags is not fast(1).tags


@pytest.mark.parametrize("frozen", [False, True])
def test_argument_errors_match(frozen: bool) -> None:
    std, fast = _pair(frozen=frozen)
    for args, kwargs in [
        ((), {}),  # missing x
        ((1, 2, [], "", 5), {}),  # too many positional
        ((1,), {"x": 2}),  # x twice
        ((1,), {"z": 2}),  # unknown keyword
        ((1,), {"seen": 2}),  # init=False field
        ((), {"tags": []}),  # missing x, a keyword given
        ((1, 2), {"y": 3, "z": 4}),  # y twice, then an unknown keyword: the first is reported
        ((1,), {"z": 4, "x": 3}),  # an unknown keyword, then x twice
    ]:
        with pytest.raises(TypeError) as expected:
            std(*args, **kwargs)
        with pytest.raises(TypeError) as got:
            fast(*args, **kwargs)
        assert str(got.value) == str(expected.value).replace(std.__qualname__, fast.__qualname__)


def test_equality_and_hash_match() -> None:
    std, fast = _pair(frozen=True)
    assert fast(1, 2) == fast(1, 2, note="other")  # note: compare=False
    assert fast(1, 2) != fast(1, 3)
    assert hash(fast(1, 2, ())) == hash(fast(1, 2, ()))  # tags as a hashable tuple
    assert hash(fast(1, 2, ())) == hash(std(1, 2, ()))
    assert fast(1) != std(1)  # different classes compare unequal, as @dataclass does
    nan = float("nan")
    assert fast(nan) == fast(nan) or fast(nan) != fast(nan)  # no error either way
    shared = fast(nan)
    assert shared == shared  # an element identical to itself counts as equal (tuples)


def test_mutable_dataclass_is_unhashable_and_assignable() -> None:
    std, fast = _pair()
    with pytest.raises(TypeError):
        hash(std(1))
    with pytest.raises(TypeError):
        hash(fast(1))
    obj = fast(1)
    obj.x = 5
    assert obj.x == 5


def test_frozen_refuses_assignment_and_deletion() -> None:
    obj = Frozen("a")
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'name'"):
        obj.name = "b"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'name'"):
        del obj.name  # type: ignore[misc]
    assert dataclasses.replace(obj, values=(1,)) == Frozen("a", (1,))


@pytest.mark.parametrize("obj", [Frozen("a", (1, 2)), Mutable("b", [3])])
def test_dataclasses_helpers_and_pickle(obj: Any) -> None:
    assert dataclasses.is_dataclass(obj)
    assert [f.name for f in dataclasses.fields(obj)] == ["name", "values"]
    assert pickle.loads(pickle.dumps(obj)) == obj
    assert type(obj).__match_args__ == ("name", "values")
    assert dataclasses.replace(obj, name="z").name == "z"
    params = type(obj).__dataclass_params__
    assert (params.init, params.repr, params.eq) == (True, True, True)
    assert params.frozen is isinstance(obj, Frozen)


@BOTH
def test_post_init_runs_after_the_fields_are_set(deco: Decorator) -> None:
    seen: list[int] = []

    @deco(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            seen.append(self.value)
            if self.value < 0:
                raise ValueError("negative")

    Checked(3)
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)
    assert seen == [3, -1]


@BOTH
def test_methods_the_class_defines_are_kept(deco: Decorator) -> None:
    @deco(frozen=True)
    class Own:
        value: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 42

    assert repr(Own(1)) == "own"
    assert Own(1) == Own(2)
    assert hash(Own(1)) == 42


@BOTH
def test_init_false_keeps_the_class_init(deco: Decorator) -> None:
    @deco(init=False)
    class Manual:
        value: int

        def __init__(self, text: str) -> None:
            self.value = int(text)

    assert Manual("5").value == 5
    assert repr(Manual("5")).endswith("Manual(value=5)")


@BOTH
def test_a_field_without_default_after_one_with_is_refused(deco: Decorator) -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @deco
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]


def test_dataclass_bases_are_refused() -> None:
    with pytest.raises(TypeError, match="inheriting dataclass"):

        @fast_dataclass
        class Child(Mutable):
            extra: int = 0


def test_recursive_repr_does_not_loop() -> None:
    obj = Mutable("self")
    obj.values.append(obj)  # type: ignore[arg-type]
    assert repr(obj) == "Mutable(name='self', values=[...])"


@BOTH
def test_several_missing_arguments_are_named_together(deco: Decorator) -> None:
    @deco
    class Three:
        a: int
        b: int
        c: int

    for args, expected in [
        ((), "missing 3 required positional arguments: 'a', 'b', and 'c'"),
        ((1,), "missing 2 required positional arguments: 'b' and 'c'"),
    ]:
        with pytest.raises(TypeError, match=expected):
            Three(*args)


def test_signature_and_docstring_match() -> None:
    import inspect

    std, fast = _pair(frozen=True)
    assert str(inspect.signature(fast)) == str(inspect.signature(std))
    assert fast.__doc__ == std.__doc__  # a class without docstring: its name and signature
    assert Frozen.__doc__ == "Frozen(name: 'str', values: 'tuple[int, ...]' = ())"


def test_a_plain_default_outside_init_stays_on_the_class() -> None:
    std, fast = _pair()
    assert "seen" not in vars(std(1)) and "seen" not in vars(fast(1))
    assert fast(1).seen == 7


@pytest.mark.parametrize("kind", ["InitVar", "kw_only", "KW_ONLY"])
def test_field_kinds_the_shared_init_cannot_take_are_refused(kind: str) -> None:
    namespace: dict[str, Any] = {"dataclasses": dataclasses, "deco": fast_dataclass}
    body = {
        "InitVar": "    a: int\n    b: dataclasses.InitVar[int] = 0\n",
        "kw_only": "    a: int = dataclasses.field(default=0, kw_only=True)\n",
        "KW_ONLY": "    a: int\n    _: dataclasses.KW_ONLY\n    b: int = 0\n",
    }[kind]
    with pytest.raises(TypeError, match="not supported"):
        # real annotations (not this module's postponed strings), as in a plain module
        exec(compile(f"@deco\nclass C:\n{body}", "<test>", "exec", dont_inherit=True), namespace)
