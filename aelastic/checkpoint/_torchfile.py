"""A ``torch.save`` file written straight into a save's mapped buffer.

``torch.save`` hands each record of its zip file to a Python file-like object through
its C++ writer, three calls a record, and pickles with per-object hooks in Python: at
16 MiB of state those, not the copy, were most of what a save cost beyond its copy.
:func:`save` writes the records itself, byte for byte the layout torch's writer produces
with ``compute_crc32`` off (stored records, each record's data aligned to the storage
alignment by a padding field, a data descriptor after each, zip64 end records), around
the pickle of :func:`_statepickle.dumps` where it takes the object, else torch's own
(``torch.serialization._save``, the pickle ``torch.save`` writes). ``torch.load``
(``weights_only`` included, and ``mmap=True``) reads it.

Falls back to ``torch.save`` where this layout would not hold: a file of 4 GiB or more
(its offsets need zip64 fields), more than 65,535 records, a torch whose ``_save``
is not the one this was written against, or a torch not in
``_statepickle.VERIFIED_TORCH`` (the version guard, see ``_statepickle``: those two
modules are the fenced place that writes torch's format by hand). Imports torch when
called.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import struct
import sys
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple, Protocol

from . import _statepickle

__all__ = ("no_crc32", "save")

#: The file's top folder, as ``torch.save`` names it for a file-like object.
_ARCHIVE = "archive/"
#: General purpose flags: names in UTF-8 (bit 11), sizes in a data descriptor after the
#: data (bit 3; an empty record has neither).
_UTF8, _DESCRIBED = 0x0800, 0x0008
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_DESCRIPTOR = struct.Struct("<IIII")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR = struct.Struct("<IIQI")
_END = struct.Struct("<IHHHHIIH")
#: A central directory entry's extra field and comment lengths, disk, attributes: none.
_NONE = (0, 0, 0, 0, 0)
#: Files this writer lays out stay below 4 GiB (no zip64 fields per record).
_LIMIT = 0xFFFFFFFF
#: The ``_save`` this writer was written against (torch 2.1 and later).
_SAVE_PARAMS = ["obj", "zip_file", "pickle_module", "pickle_protocol", "_disable_byteorder_record"]


class Sink(Protocol):
    """Where the bytes go (``_buffer.MapWriter``): appended at ``pos``; file-like
    enough for ``torch.save``."""

    pos: int

    def write(self, data: bytes | memoryview) -> int: ...

    def flush(self) -> None: ...


class _Records:
    """The ``zip_file`` torch's ``_save`` writes its records to."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.entries: list[tuple[bytes, int, int, int]] = []  # name, offset, size, flags
        self.alignment = 64
        #: bytes for the sink not written yet: small records and headers go with the
        #: next write, so a tensor's record costs two (its header, its bytes)
        self.pending = b""

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if name == ".storage_alignment":  # written before the first tensor's record
            self.alignment = int(data)
        sink = self.sink
        encoded = (_ARCHIVE + name).encode()
        offset = sink.pos + len(self.pending)
        start = offset + _LOCAL.size + len(encoded) + 4
        pad = -start % self.alignment
        flags = _UTF8 | _DESCRIBED if nbytes else _UTF8
        header = (
            _LOCAL.pack(0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(encoded), 4 + pad)
            + encoded
            + struct.pack("<HH", 0x4246, pad)  # "FB": miniz's padding field
            + b"Z" * pad
        )
        described = _DESCRIPTOR.pack(0x08074B50, 0, nbytes, nbytes) if nbytes else b""
        if isinstance(data, (bytes, str)) or not nbytes:
            self.pending += header + _view(data, nbytes) + described
        else:
            sink.write(self.pending + header)
            sink.write(_view(data, nbytes))
            self.pending = described
        self.entries.append((encoded, offset, nbytes, flags))

    def write_record_metadata(self, name: str, nbytes: int) -> None:
        raise NotImplementedError  # torch.serialization.skip_data: torch.save's own path

    def finish(self, serialization_id: str) -> None:
        """The records torch's writer adds at its end, the central directory, the end
        records."""
        self.write_record("version", "3\n", 2)
        self.write_record(".data/serialization_id", serialization_id, len(serialization_id))
        directory = self.sink.pos + len(self.pending)
        entries = b"".join(_central(*entry) for entry in self.entries)
        n, end64 = len(self.entries), directory + len(entries)
        size = end64 - directory
        self.sink.write(
            self.pending
            + entries
            + _END64.pack(0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, size, directory)
            + _LOCATOR.pack(0x07064B50, 0, end64, 1)
            + _END.pack(0x06054B50, 0, 0, n, n, size, directory, 0)
        )


def _central(name: bytes, offset: int, size: int, flags: int) -> bytes:
    """A record's entry in the central directory."""
    fields = (flags, 0, 0, 0, 0, size, size, len(name), *_NONE, offset)
    return _CENTRAL.pack(0x02014B50, 0, 0, *fields) + name


def _view(data: Any, nbytes: int) -> bytes | memoryview:
    """The bytes of a record: ``bytes``, ``str``, or a CPU storage (read in place)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    import ctypes  # (here: the agent imports this module and needs no ctypes)

    return memoryview((ctypes.c_char * nbytes).from_address(data.data_ptr())).cast("B")


class _Torch(NamedTuple):
    """torch's modules a save uses, imported once (an import statement in a function
    costs microseconds on every call)."""

    torch: Any
    serialization: Any
    #: ``torch.utils.serialization.config`` (None: a torch without it)
    config: Any
    #: whether ``serialization._save`` is the one this writer was written against and
    #: this torch a verified one (else: ``torch.save``)
    usable: bool


@functools.cache
def _torch() -> _Torch:
    import torch
    import torch.serialization as serialization

    config: Any = None
    with contextlib.suppress(ImportError):
        from torch.utils.serialization import config
    save = getattr(serialization, "_save", None)
    try:
        params = list(inspect.signature(save).parameters) if save else []
    except (TypeError, ValueError):
        params = []
    usable = params == _SAVE_PARAMS and _statepickle.verified()
    return _Torch(torch, serialization, config, usable)


@contextlib.contextmanager
def no_crc32() -> Iterator[None]:
    """``torch.save`` without the zip records' CRC-32 (a third of its time; torch.load
    does not need it), for this block only: torch's option set and put back (its
    ``config.patch`` costs 18 us a call, this 3)."""
    config = _torch().config
    if config is None:
        yield
        return
    options = config.save
    before = options.compute_crc32
    options.compute_crc32 = False
    try:
        yield
    finally:
        options.compute_crc32 = before


def save(
    obj: Any,
    sink: Sink,
    tensor_bytes: int,
    records: int,
    pickled: _statepickle.Pickled | Literal["make"] | None = "make",
) -> None:
    """Write ``obj`` as ``torch.save(obj, sink)`` would with ``compute_crc32`` off, into
    ``sink``: ``tensor_bytes`` and ``records`` (its distinct storages) choose between
    this writer and ``torch.save`` itself; ``pickled``: ``obj``'s
    :func:`_statepickle.dumps` if the caller made it (None: it refused ``obj``), else
    ``"make"``. Raises what pickling raises."""
    t = _torch()
    fits = tensor_bytes + (records + 8) * 1024 + (1 << 20) < _LIMIT and records < 0xFFF0
    if not (fits and t.usable) or t.serialization._serialization_tls.skip_data:
        with no_crc32():
            t.torch.save(obj, sink)
        return
    zip_file = _Records(sink)
    if pickled == "make":
        pickled = _statepickle.dumps(obj)
    alignment = getattr(getattr(t.config, "save", None), "storage_alignment", None)
    if pickled is None or not isinstance(alignment, int):
        import pickle

        t.serialization._save(obj, zip_file, pickle, 2, False)
    else:  # the records torch's _save writes, in its order
        zip_file.write_record("data.pkl", pickled.data, len(pickled.data))
        zip_file.write_record(".format_version", "1", 1)
        zip_file.write_record(".storage_alignment", str(alignment), len(str(alignment)))
        zip_file.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        for key, storage in enumerate(pickled.storages):
            zip_file.write_record(f"data/{key}", storage, storage.nbytes())
    zip_file.finish(str(int.from_bytes(os.urandom(16), "little")).zfill(40)[:40])
