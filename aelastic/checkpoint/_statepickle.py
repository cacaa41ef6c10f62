"""The pickle of a state (``state_dict()``s, nested), written without torch's hooks.

``torch.save`` pickles with a ``persistent_id`` in Python, which CPython's pickler calls
for every object (19 times per tensor of a ``state_dict``), and reduces each tensor in
Python: 17-22 us per tensor here, 5.7 ms for a 300-tensor state, paid on every save.
:func:`dumps` writes the same program directly (pickle protocol 2, the one
``torch.save`` uses): the opcodes ``torch.load`` reads for a tensor
(``torch._utils._rebuild_tensor_v2`` of a persistent ``("storage", ...)`` id), about
5 us per tensor. Its globals are written once and read back from the memo, as
``pickle`` does.

It takes what states are made of: dicts, ``OrderedDict`` (with its attributes, e.g. a
``state_dict``'s ``_metadata``), lists, tuples, str, int, float, bool, None, and plain
CPU tensors (``torch.Tensor``, strided, dense). Anything else, a dict or list met twice
(shared or cyclic: ``pickle`` keeps that sharing, this writer would not), two tensors
viewing one storage as different dtypes, a torch without the pieces named in
:func:`_parts`, or a torch not in :data:`VERIFIED_TORCH`: :func:`dumps` returns None and
the caller pickles with torch's own code.

The fence: this module and ``_torchfile`` are the only code that writes torch's file
format by hand (pickle opcodes naming torch-private functions, zip records). Both run
only on a torch whose major.minor is in :data:`VERIFIED_TORCH` (checked once per process
by :func:`verified`, which logs the choice once); any other torch saves with
``torch.save``, the same files, slower. To add a version: run
``tests/test_checkpoint_format.py`` on it (it reads these files back with plain
``torch.load(weights_only=True, mmap=True)`` and compares each tensor), then add it.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections import OrderedDict
from typing import Any

__all__ = ("VERIFIED_TORCH", "Pickled", "dumps", "verified")

#: torch versions (major, minor) whose files this writer and ``_torchfile`` were checked
#: against by tests/test_checkpoint_format.py; any other saves with ``torch.save``.
VERIFIED_TORCH: tuple[tuple[int, int], ...] = ((2, 13),)

_log = logging.getLogger(__name__)

_PROTO = b"\x80\x02"
_STOP = b"."
_MARK = b"("
_EMPTY_DICT, _SETITEMS = b"}", b"u"
_EMPTY_LIST, _APPENDS = b"]", b"e"
_EMPTY_TUPLE, _TUPLE = b")", b"t"
_TUPLES = (_EMPTY_TUPLE, b"\x85", b"\x86", b"\x87")  # tuples of 0 to 3 items
_NONE, _TRUE, _FALSE = b"N", b"\x88", b"\x89"
_REDUCE, _BUILD, _BINPERSID = b"R", b"b", b"Q"
_ORDERED_DICT = b"ccollections\nOrderedDict\n"
_REBUILD_TENSOR = b"ctorch._utils\n_rebuild_tensor_v2\n"
_BINPUT, _BINGET, _LONG_BINPUT, _LONG_BINGET = b"q", b"h", b"r", b"j"
_STORAGE = b"X\x07\x00\x00\x00storage"
_CPU = b"X\x03\x00\x00\x00cpu"
_U4 = struct.Struct("<I")
_I4 = struct.Struct("<i")
_DOUBLE = struct.Struct(">d")


class _Unsupported(Exception):
    """Not a state this writer takes: the caller pickles with torch's code."""


class Pickled:
    """``data.pkl``'s bytes and the storages it names, in key order (``"0"``, ``"1"``...)."""

    def __init__(self, data: bytes, storages: list[Any]) -> None:
        self.data = data
        self.storages = storages


def _major_minor(version: str) -> tuple[int, int] | None:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; None for a version string not shaped so."""
    numbers = version.split("+")[0].split(".")[:2]
    try:
        major, minor = (int(n) for n in numbers)
    except ValueError:
        return None
    return major, minor


@functools.cache
def verified() -> bool:
    """Whether the installed torch is one the hand-written save format was verified on
    (see the module's text); decided once per process and logged once (INFO when the
    fast path is used, WARNING when ``torch.save`` is used instead). Imports torch."""
    import torch

    version = str(torch.__version__)
    ok = _major_minor(version) in VERIFIED_TORCH
    if ok:
        _log.info("checkpoint save: fast writer (torch %s is verified)", version)
    else:
        known = ", ".join(f"{a}.{b}" for a, b in VERIFIED_TORCH)
        _log.warning(
            "checkpoint save: torch %s is not a version the fast writer was verified "
            "on (%s); saving with torch.save (same files, slower)",
            version,
            known,
        )
    return ok


@functools.cache
def _parts() -> tuple[Any, dict[Any, bytes]] | None:
    """torch's pieces this writer relies on, found once: ``(torch, {dtype: the pickled
    global of its storage type})`` for the dtypes torch pickles this way; None where a
    torch lacks one of them."""
    import torch

    if not verified():
        return None
    try:
        names = torch.storage._dtype_to_storage_type_map()
        other = set(torch.storage._new_dtypes())  # pickled another way by torch
        torch._utils._rebuild_tensor_v2  # noqa: B018  # what the pickle calls
        torch._utils.get_tensor_metadata  # noqa: B018
    except AttributeError:
        return None
    return torch, {
        dtype: f"ctorch\n{name}\n".encode()
        for dtype, name in names.items()
        if dtype not in other and hasattr(torch, name)
    }


#: BININT1 of 0 to 255.
_SMALL = [b"K" + bytes((i,)) for i in range(0x100)]


def _long(value: int) -> bytes:
    if 0 <= value < 0x100:
        return _SMALL[value]
    if 0 <= value < 0x10000:
        return b"M" + value.to_bytes(2, "little")
    if -0x80000000 <= value < 0x80000000:
        return b"J" + _I4.pack(value)
    import pickle  # (here: the agent imports this module and needs no pickle)

    encoded = pickle.encode_long(value)
    if len(encoded) >= 0x100:
        raise _Unsupported
    return b"\x8a" + bytes((len(encoded),)) + encoded


def _str(value: str) -> bytes:
    encoded = value.encode("utf-8", "surrogatepass")
    return b"X" + _U4.pack(len(encoded)) + encoded


class _Writer:
    def __init__(self, torch: Any, dtypes: dict[Any, bytes]) -> None:
        self.torch = torch
        self.tensor = torch.Tensor
        self.strided = torch.strided
        self.metadata = torch._utils.get_tensor_metadata
        self.dtypes = dtypes
        self.out: list[bytes] = [_PROTO]
        self.seen: set[int] = set()
        self.keys: dict[int, bytes] = {}  # a storage's _cdata: its key, pickled
        self.kinds: dict[int, Any] = {}  # a storage's data_ptr: the dtype it is seen as
        self.storages: list[Any] = []
        self.memo: dict[bytes, bytes] = {}  # a global: the opcode that reads it back

    def named(self, global_: bytes) -> bytes:
        """A global (``c module\\nname\\n``): written once and kept in the memo, read
        from there after (what ``pickle`` does, and fewer lookups for ``torch.load``)."""
        again = self.memo.get(global_)
        if again is not None:
            return again
        n = len(self.memo)
        if n < 0x100:
            self.memo[global_] = _BINGET + bytes((n,))
            return global_ + _BINPUT + bytes((n,))
        self.memo[global_] = _LONG_BINGET + _U4.pack(n)
        return global_ + _LONG_BINPUT + _U4.pack(n)

    def once(self, obj: Any) -> None:
        key = id(obj)
        if key in self.seen:
            raise _Unsupported
        self.seen.add(key)

    def put(self, obj: Any) -> None:
        out = self.out
        kind = type(obj)
        if kind is str:  # the most frequent first: a state dict's keys and tensors
            out.append(_str(obj))
        elif kind is self.tensor:
            self.put_tensor(obj)
        elif kind is int:
            out.append(_SMALL[obj] if 0 <= obj < 0x100 else _long(obj))
        elif obj is None:
            out.append(_NONE)
        elif kind is bool:
            out.append(_TRUE if obj else _FALSE)
        elif kind is float:
            out.append(b"G" + _DOUBLE.pack(obj))
        elif kind is dict:
            self.once(obj)
            out.append(_EMPTY_DICT)
            self.put_items(obj)
        elif kind is OrderedDict:
            self.once(obj)
            out.append(self.named(_ORDERED_DICT) + _EMPTY_TUPLE + _REDUCE)
            self.put_items(obj)
            state = getattr(obj, "__dict__", None)
            if state:
                self.put(dict(state))
                out.append(_BUILD)
        elif kind is list:
            self.once(obj)
            out.append(_EMPTY_LIST)
            if obj:
                out.append(_MARK)
                for item in obj:
                    self.put(item)
                out.append(_APPENDS)
        elif kind is tuple:  # immutable: one met twice is written twice
            if len(obj) > 3:
                out.append(_MARK)
            for item in obj:
                self.put(item)
            out.append(_TUPLES[len(obj)] if len(obj) <= 3 else _TUPLE)
        else:
            raise _Unsupported

    def put_items(self, obj: dict[Any, Any]) -> None:
        if not obj:
            return
        self.out.append(_MARK)
        for key, value in obj.items():
            self.put(key)
            self.put(value)
        self.out.append(_SETITEMS)

    def put_tensor(self, t: Any) -> None:
        if (
            not t.is_cpu
            or t.layout is not self.strided
            or t.is_quantized
            or t.is_nested
            or t.__dict__
            or t._backward_hooks
            or t.is_conj()
            or t.is_neg()
            or any(getattr(t, "names", None) or ())
            or self.metadata(t)
        ):
            raise _Unsupported
        storage_type = self.dtypes.get(t.dtype)
        if storage_type is None:
            raise _Unsupported
        storage = t.untyped_storage()
        pointer = storage.data_ptr()
        if pointer and self.kinds.setdefault(pointer, t.dtype) != t.dtype:
            raise _Unsupported  # torch's own code raises what this is
        key = self.keys.get(storage._cdata)
        if key is None:
            key = self.keys[storage._cdata] = _str(str(len(self.keys)))
            self.storages.append(storage)
        named = self.named
        self.out += (
            named(_REBUILD_TENSOR),
            _MARK + _MARK + _STORAGE,
            named(storage_type),
            key,
            _CPU,
            _long(storage.nbytes() // t.element_size()),
            _TUPLE + _BINPERSID,
            _long(t.storage_offset()),
            _ints(t.size()),
            _ints(t.stride()),
            _TRUE if t.requires_grad else _FALSE,
            named(_ORDERED_DICT),  # no backward hooks: an empty OrderedDict
            _EMPTY_TUPLE + _REDUCE + _TUPLE + _REDUCE,
        )


def _ints(values: Any) -> bytes:
    """A tuple of ints (a size, a stride)."""
    n = len(values)
    items = b"".join([_SMALL[v] if 0 <= v < 0x100 else _long(v) for v in values])
    return items + _TUPLES[n] if n <= 3 else _MARK + items + _TUPLE


def dumps(obj: Any) -> Pickled | None:
    """``obj``'s pickle as ``torch.save`` would load it, and its storages; None when
    ``obj`` holds something this writer does not take (see the module's text)."""
    parts = _parts()
    if parts is None:
        return None
    writer = _Writer(*parts)
    try:
        writer.put(obj)
    except (_Unsupported, RecursionError):
        return None
    writer.out.append(_STOP)
    return Pickled(b"".join(writer.out), writer.storages)
