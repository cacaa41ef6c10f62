"""A save's file is a ``torch.save`` file: the zip laid out as torch lays it out, the
pickle of a state written without torch's per-object hooks, read back by ``torch.load``
(``weights_only`` and ``mmap`` included) as torch's own file is."""

from __future__ import annotations

import collections
import io
import logging
import math
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.serialization import config

from aelastic.checkpoint import _statepickle, _torchfile


class _Sink:
    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.pos = 0

    def write(self, data: bytes | memoryview) -> int:
        n = memoryview(data).nbytes
        self.buffer.write(data)
        self.pos += n
        return n

    def flush(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_crc32() -> Iterator[None]:
    """As a save runs torch.save (its records' CRC-32 off)."""
    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    yield
    config.save.compute_crc32 = before


def ours(obj: Any, tensor_bytes: int = 0) -> bytes:
    sink = _Sink()
    _torchfile.save(obj, sink, tensor_bytes, 1)
    return sink.buffer.getvalue()


def torchs(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def same(a: Any, b: Any, path: str = "state") -> None:
    assert type(a) is type(b), path
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) == (
            b.dtype,
            b.shape,
            b.stride(),
            b.storage_offset(),
            b.requires_grad,
        ), path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        assert getattr(a, "__dict__", {}).keys() == getattr(b, "__dict__", {}).keys(), path
        for key in a:
            same(a[key], b[key], f"{path}[{key!r}]")
        for key, value in getattr(a, "__dict__", {}).items():
            same(value, b.__dict__[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), path  # NaN is NaN


def training_state() -> dict[str, Any]:
    """What a training loop saves: a model's and an optimizer's state dicts (with their
    OrderedDict and ``_metadata``), RNG state, views of one storage, odd dtypes, and the
    plain values around them."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    base = torch.arange(12.0).reshape(3, 4)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "views": [base, base[1], base.t(), base[:, 1:3]],
        "dtypes": [
            torch.tensor([-1, 2], dtype=torch.int8),
            torch.ones(2, 2, dtype=torch.bfloat16),
            torch.tensor([True]),
            torch.randn(2, dtype=torch.complex64),
            torch.tensor(3.0),
            torch.zeros(0, 3),
        ],
        "ints": [7, 300, 70000, -5, 2**40, -(2**70)],
        "plain": (1.5, math.inf, math.nan, "héllo \ud800", None, True, False, ("a", "b", "c", "d")),
        "requires_grad": torch.ones(2, requires_grad=True),
        "many_dims": torch.zeros(1, 2, 1, 2, 1),
    }


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_training_state_loads_as_torch_saves_own_file_does(weights_only: bool) -> None:
    state = training_state()
    assert _statepickle.dumps(state) is not None  # the fast pickle, not torch's
    ours_back = torch.load(io.BytesIO(ours(state)), weights_only=weights_only)
    torchs_back = torch.load(io.BytesIO(torchs(state)), weights_only=weights_only)
    same(torchs_back, ours_back)
    same(state, ours_back)
    views = ours_back["views"]
    assert {v.untyped_storage().data_ptr() for v in views} == {views[0].data_ptr()}


def test_a_saved_file_maps_with_torch_load_mmap(tmp_path: Path) -> None:
    state = training_state()
    path = tmp_path / "rank_0.pt"
    path.write_bytes(ours(state))
    back = torch.load(path, mmap=True, weights_only=True)
    same(state, back)
    views = back["views"]
    assert {v.untyped_storage().data_ptr() for v in views} == {views[0].data_ptr()}


def test_the_zip_is_laid_out_byte_for_byte_as_torch_lays_it_out() -> None:
    """With torch's own pickle (a Parameter is not a plain tensor), the only difference
    from torch.save's bytes is the random serialization id."""
    state = {"p": torch.nn.Parameter(torch.ones(3)), "empty": torch.zeros(0), "x": torch.arange(5)}
    assert _statepickle.dumps(state) is None
    a, b = ours(state), torchs(state)
    assert len(a) == len(b)
    za, zb = zipfile.ZipFile(io.BytesIO(a)), zipfile.ZipFile(io.BytesIO(b))
    assert za.namelist() == zb.namelist()
    id_info = za.getinfo("archive/.data/serialization_id")
    start = a.index(b"archive/.data/serialization_id", id_info.header_offset)
    data = start + len("archive/.data/serialization_id")
    data += int.from_bytes(a[id_info.header_offset + 28 : id_info.header_offset + 30], "little")
    assert a[:data] == b[:data]
    assert a[data + 40 :] == b[data + 40 :]
    assert a[data : data + 40].isdigit()


@pytest.mark.parametrize(
    "what, obj",
    [
        ("a Parameter", {"p": torch.nn.Parameter(torch.ones(1))}),
        ("a list met twice", {"a": (shared := [1]), "b": shared}),
        ("bytes", {"b": b"raw"}),
        ("a set", {"s": {1, 2}}),
        ("a dict subclass", {"d": collections.defaultdict(int, a=1)}),
        ("an object", {"o": collections.Counter("ab")}),
    ],
)
def test_what_the_fast_pickle_does_not_take_goes_through_torchs_own(what: str, obj: Any) -> None:
    assert _statepickle.dumps(obj) is None, what
    same(obj, torch.load(io.BytesIO(ours(obj)), weights_only=False))


def test_a_cycle_goes_through_torchs_own_pickle() -> None:
    cyclic: list[Any] = [torch.ones(1)]
    cyclic.append(cyclic)
    assert _statepickle.dumps(cyclic) is None
    back = torch.load(io.BytesIO(ours(cyclic)), weights_only=False)
    assert back[1] is back


def test_one_storage_seen_as_two_dtypes_raises_torchs_error() -> None:
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        ours([x, x.view(torch.int32)])


def test_a_file_of_4_gib_or_more_is_written_by_torch_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its offsets would need zip64 fields per record, which this layout has not."""

    def refuse(obj: object) -> None:
        raise AssertionError("the fast pickle ran for a file of 4 GiB")

    monkeypatch.setattr(_statepickle, "dumps", refuse)
    state = {"x": torch.arange(3.0)}
    same(state, torch.load(io.BytesIO(ours(state, tensor_bytes=1 << 32)), weights_only=True))


@pytest.fixture
def _guard_afresh() -> Iterator[None]:
    """The version guard decided afresh in the test, and again after it."""

    def clear() -> None:
        _statepickle.verified.cache_clear()
        _statepickle._parts.cache_clear()
        _torchfile._torch.cache_clear()

    clear()
    yield
    clear()


@pytest.mark.usefixtures("_guard_afresh")
def test_this_torch_is_a_verified_one_and_takes_the_fast_path() -> None:
    # (the tests above check the hand-written files; they must not be torch.save's)
    major, minor = (int(n) for n in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) not in _statepickle.VERIFIED_TORCH:
        pytest.skip(f"torch {torch.__version__} not verified: every save is torch.save's")
    assert _statepickle.verified()
    assert _torchfile._torch().usable


@pytest.mark.usefixtures("_guard_afresh")
def test_an_unverified_torch_saves_with_torch_save_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_statepickle, "VERIFIED_TORCH", ((1, 0),))
    state = training_state()
    with caplog.at_level(logging.INFO, logger=_statepickle.__name__):
        assert _statepickle.dumps(state) is None  # the hand-written pickle steps aside
        assert not _torchfile._torch().usable  # and so does the zip writer
        files = [ours(state), ours(state)]
    said = [r for r in caplog.records if r.name == _statepickle.__name__]
    assert len(said) == 1, said
    assert said[0].levelno == logging.WARNING
    assert torch.__version__ in said[0].getMessage()
    assert "torch.save" in said[0].getMessage()
    for i, data in enumerate(files):
        path = tmp_path / f"rank_{i}.pt"
        path.write_bytes(data)
        for mmap in (False, True):
            back = torch.load(path, weights_only=True, mmap=mmap)
            same(state, back)
            views = back["views"]
            assert {v.untyped_storage().data_ptr() for v in views} == {views[0].data_ptr()}


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.13.0+cpu", (2, 13)), ("2.13.1", (2, 13)), ("3.0", (3, 0)), ("nightly", None)],
)
def test_the_guard_reads_major_and_minor(version: str, expected: tuple[int, int] | None) -> None:
    assert _statepickle._major_minor(version) == expected
