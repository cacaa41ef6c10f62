"""Property tests of the sans-IO protocol and of the live server against garbage."""

from __future__ import annotations

from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aelastic.store import StoreServer, TCPStoreClient
from aelastic.store import _protocol as P
from aelastic.store._exceptions import ProtocolError

from ._fakes import FakeSocket, connection

keys = st.binary(max_size=40)
values = st.binary(max_size=200)
key_lists = st.lists(keys, max_size=5)

# (encoded request, expected parsed tuple)
requests = st.one_of(
    st.tuples(keys, values).map(lambda a: (P.request_set(*a), (1, *a))),
    st.tuples(keys, values, values).map(lambda a: (P.request_compare_set(*a), (2, *a))),
    keys.map(lambda k: (P.request_get(k), (3, k))),
    st.tuples(keys, st.integers(-(2**63), 2**63 - 1)).map(lambda a: (P.request_add(*a), (4, *a))),
    key_lists.map(lambda ks: (P.request_check(ks), (5, ks))),
    key_lists.map(lambda ks: (P.request_wait(ks), (6, ks))),
    st.just((P.request_num_keys(), (7,))),
    keys.map(lambda k: (P.request_delete_key(k), (8, k))),
    st.tuples(keys, values).map(lambda a: (P.request_append(*a), (9, *a))),
    key_lists.map(lambda ks: (P.request_multi_get(ks), (10, ks))),
    st.lists(st.tuples(keys, values), max_size=4).map(
        lambda kv: (
            P.request_multi_set([k for k, _ in kv], [v for _, v in kv]),
            (11, [k for k, _ in kv], [v for _, v in kv]),
        )
    ),
    st.just((P.request_cancel_wait(), (12,))),
    st.integers(0, 2**32 - 1).map(lambda n: (P.request_ping(n), (13, n))),
    st.tuples(keys, values).map(lambda a: (P.request_queue_push(*a), (14, *a))),
    keys.map(lambda k: (P.request_queue_pop(k), (15, k))),
    keys.map(lambda k: (P.request_queue_len(k), (16, k))),
    st.just((P.request_list_keys(), (17,))),
    st.tuples(keys, st.integers(1, 1000)).map(lambda a: (P.request_barrier(*a), (18, *a))),
    st.just((P.request_ae_hello(), (0xA0,))),
    st.tuples(st.sampled_from([1, 8, 9, 14]), keys, values).map(
        lambda a: (P.request_on_close(*a), (0xA1, *a))
    ),
    st.integers(-1, 2**40).map(lambda n: (P.request_on_close_cancel(n), (0xA2, n))),
    keys.map(lambda k: (P.request_get_wait(k), (0xA3, k))),
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


@given(st.lists(requests, max_size=12), st.lists(st.integers(0, 10_000), max_size=12))
def test_valid_frames_split_anywhere_parse_identically(
    reqs: list[tuple[bytes, tuple[Any, ...]]], cuts: list[int]
) -> None:
    data = P.request_validate() + b"".join(r for r, _ in reqs)
    parser = P.RequestParser()
    parsed: list[Any] = []
    for piece in _split(data, cuts):
        parsed.extend(parser.feed(piece))
    assert parsed == [(0, P.MAGIC)] + [expected for _, expected in reqs]
    assert parser.buffered == 0


@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=6), st.booleans())
def test_garbage_only_raises_protocol_error(data: bytes, cuts: list[int], validated: bool) -> None:
    parser = P.RequestParser(max_key_size=64, max_value_size=256, max_key_count=8)
    prefix = P.request_validate() if validated else b""
    try:
        for piece in _split(prefix + data, cuts):
            for req in parser.feed(piece):
                assert isinstance(req, tuple) and req[0] in set(P.Opcode)
    except ProtocolError:
        pass


@given(
    st.lists(
        st.one_of(
            values.map(lambda v: (P.Reply.BYTES, 0, P.encode_bytes(v), v)),
            st.integers(-(2**63), 2**63 - 1).map(lambda n: (P.Reply.I64, 0, P.encode_i64(n), n)),
            st.integers(0, 255).map(lambda n: (P.Reply.U8, 0, P.encode_u8(n), n)),
            st.lists(values, max_size=4).map(
                lambda vs: (P.Reply.BYTES_LIST, len(vs), P.encode_bytes_list(vs), vs)
            ),
            st.lists(values, max_size=4).map(
                lambda vs: (P.Reply.STRING_LIST, 0, P.encode_string_list(vs), vs)
            ),
            st.one_of(st.none(), values).map(
                lambda v: (P.Reply.QUEUE_POP, 0, P.encode_queue_pop(v), v)
            ),
        ),
        max_size=10,
    ),
    st.lists(st.integers(0, 5000), max_size=10),
)
def test_responses_split_anywhere_parse_identically(
    replies: list[tuple[P.Reply, int, bytes, Any]], cuts: list[int]
) -> None:
    parser = P.ResponseParser()
    for kind, count, _, _ in replies:
        parser.expect(kind, count)
    got: list[Any] = []
    for piece in _split(b"".join(r[2] for r in replies), cuts):
        got.extend(parser.feed(piece))
    assert got == [r[3] for r in replies]
    assert parser.pending == 0


async def _garbage_round(garbage: bytes, validated: bool) -> None:
    async with StoreServer() as server:
        async with TCPStoreClient(server.host, server.port, timeout=5) as client:
            await client.set("keep", "me")
            async with await anyio.connect_tcp(server.host, server.port) as raw:
                await raw.send((P.request_validate() if validated else b"") + garbage)
                await raw.send_eof()
                with anyio.fail_after(5):
                    try:
                        while await raw.receive():
                            pass
                    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                        pass
            assert await client.get("keep") == b"me"
            assert await client.add("counter", 1) == 1
        async with TCPStoreClient(server.host, server.port, timeout=5) as again:
            assert await again.get("keep") == b"me"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=200), st.booleans())
def test_live_server_survives_garbage(garbage: bytes, validated: bool) -> None:
    anyio.run(_garbage_round, garbage, validated)


def _connection() -> tuple[Any, FakeSocket]:
    return connection(StoreServer(), validate=False)


small_keys = st.sampled_from([b"/a", b"/b", b"/c"])
hot_requests = st.one_of(
    st.tuples(small_keys, values).map(lambda a: P.request_set(*a)),
    small_keys.map(P.request_get),
    small_keys.map(lambda k: P.request_wait([k])),
    st.tuples(small_keys, small_keys).map(lambda ks: P.request_wait(list(ks))),
    small_keys.map(lambda k: P.request_add(b"/n", 1)),
    small_keys.map(lambda k: P.request_check([k])),
    st.just(P.request_cancel_wait()),
)


@given(st.lists(hot_requests, max_size=15), st.lists(st.integers(0, 3000), max_size=8))
def test_server_fast_path_matches_generic_path(frames: list[bytes], cuts: list[int]) -> None:
    """Whole segments (fast path) and 1-byte segments (generic path only) agree."""
    data = P.request_validate() + b"".join(frames)
    fast, fast_out = _connection()
    for piece in _split(data, cuts):
        if piece:
            fast.data_received(piece)
    slow, slow_out = _connection()
    for i in range(len(data)):
        slow.data_received(data[i : i + 1])
    assert bytes(fast_out.out) == bytes(slow_out.out)
    assert fast._state.data == slow._state.data
    assert not fast_out.closed and not slow_out.closed
