"""The request parser is linear: a multi-key frame is parsed once, item by item."""

from __future__ import annotations

import pytest

from aelastic.store import _protocol as P
from aelastic.store._exceptions import ProtocolError


def _multi_set(n: int, value: bytes) -> tuple[list[bytes], list[bytes], bytes]:
    keys = [b"/k%06d" % i for i in range(n)]
    values = [value] * n
    return keys, values, P.request_multi_set(keys, values)


def test_multi_key_frame_holds_back_at_most_one_item() -> None:
    # the quadratic parser kept (and re-parsed) the whole frame so far on every feed
    keys, values, frame = _multi_set(2000, b"v" * 100)
    item = 8 + 7 + 8 + 100
    parser = P.RequestParser()
    assert parser.feed(P.request_validate()) == [(0, P.MAGIC)]
    out = []
    for i in range(0, len(frame), 1000):
        out += parser.feed(frame[i : i + 1000])
        raw_held = parser.buffered - (parser._multi.size if parser._multi else 0)
        assert raw_held < item + 1000
    assert out == [(11, keys, values)]
    assert parser.ready and parser.buffered == 0


@pytest.mark.parametrize("op", [P.request_wait, P.request_check, P.request_multi_get])
def test_key_lists_split_byte_by_byte(op: object) -> None:
    keys = [b"/a", b"", b"/ccc" * 50]
    frame = op(keys)  # type: ignore[operator]
    parser = P.RequestParser(require_validate=False)
    out = []
    for i in range(len(frame)):
        out += parser.feed(frame[i : i + 1])
    assert out == [(frame[0], keys)]


def test_buffered_counts_parsed_items_of_an_incomplete_frame() -> None:
    _, _, frame = _multi_set(100, b"x" * 50)
    parser = P.RequestParser(require_validate=False)
    assert parser.feed(frame[:-10]) == []
    assert parser.buffered == len(frame) - 10
    assert parser.feed(frame[-10:])[0][0] == 11


def test_frame_limit_counts_every_item() -> None:
    _, _, frame = _multi_set(100, b"x" * 1000)
    parser = P.RequestParser(require_validate=False, max_frame_size=50_000)
    with pytest.raises(ProtocolError, match="max_frame_size"):
        for i in range(0, len(frame), 4096):
            parser.feed(frame[i : i + 4096])


def test_frame_limit_applies_when_the_frame_comes_whole() -> None:
    _, _, frame = _multi_set(100, b"x" * 1000)
    parser = P.RequestParser(require_validate=False, max_frame_size=50_000)
    with pytest.raises(ProtocolError, match="frame limit of 50000 bytes"):
        parser.feed(frame)
