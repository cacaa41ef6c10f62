"""The server's fused fast path answers exactly like the generic parser + dispatch."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aelastic.store import StoreServer
from aelastic.store import _protocol as P
from aelastic.store._server_conn import _FAST_VALUE_LIMIT, _Connection

from ._fakes import FakeSocket, connection


def _conn(server: StoreServer) -> tuple[_Connection, FakeSocket]:
    return connection(server)


def test_pipelined_answers_of_one_segment_are_written_once() -> None:
    conn, transport = _conn(StoreServer())
    conn.data_received(P.request_set(b"k", b"v" * 10))
    conn.data_received(b"".join([P.request_get(b"k")] * 10 + [P.request_wait([b"k"])]))
    assert transport.writes == 1
    assert bytes(transport.out) == (P.encode_bytes(b"v" * 10)) * 10 + b"\x00"


_keys = st.sampled_from([b"/a", b"/b", b""])
# distinct lengths and bytes, so that answers in the wrong order cannot compare equal
_values = st.sampled_from([b"", b"\x07" * 3, b"x" * 64, b"y" * (_FAST_VALUE_LIMIT + 1)])
# (connection index, request bytes)
_ops = st.one_of(
    st.tuples(st.integers(0, 1), st.tuples(_keys, _values).map(lambda a: P.request_set(*a))),
    st.tuples(st.integers(0, 1), _keys.map(P.request_get)),
    st.tuples(st.integers(0, 1), _keys.map(lambda k: P.request_wait([k]))),
    st.tuples(st.integers(0, 1), _keys.map(lambda k: P.request_check([k]))),
    st.tuples(st.integers(0, 1), _keys.map(P.request_delete_key)),
)


def _run(ops: list[tuple[int, bytes]], chunk: Any) -> tuple[list[bytes], dict[bytes, bytes]]:
    server = StoreServer()
    conns = [_conn(server) for _ in range(2)]
    for i, frame in ops:
        conn, _ = conns[i]
        for piece in chunk(frame):
            conn.data_received(piece)
    for _, t in conns:
        assert not t.closed
    return [bytes(t.out) for _, t in conns], dict(server._state.data)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ops, max_size=14), st.integers(1, 40))
def test_fast_path_matches_generic_path_across_connections(
    ops: list[tuple[int, bytes]], cut: int
) -> None:
    """Whole frames and arbitrary splits (fast path where it applies) match
    1-byte feeding (generic path only): same answers on each connection, in the
    same order (including WAITs woken by another connection's SET), same data."""
    whole = _run(ops, lambda f: [f])
    coalesced: list[tuple[int, bytes]] = []  # a connection's consecutive frames in one segment
    for i, frame in ops:
        if coalesced and coalesced[-1][0] == i:
            coalesced[-1] = (i, coalesced[-1][1] + frame)
        else:
            coalesced.append((i, frame))
    assert _run(coalesced, lambda f: [f]) == _run(
        ops, lambda f: [f[i : i + 1] for i in range(len(f))]
    )
    split = _run(ops, lambda f: [f[i : i + cut] for i in range(0, len(f), cut)])
    generic = _run(ops, lambda f: [f[i : i + 1] for i in range(len(f))])
    assert whole == generic
    assert split == generic


def test_set_waking_own_wait_keeps_answer_order() -> None:
    """A segment GET + SET that wakes the same connection's earlier WAIT answers
    the GET first, then the WAIT, exactly like the generic path."""
    frames = [
        P.request_set(b"/b", b"v"),
        P.request_wait([b"/a"]),
        P.request_get(b"/b") + P.request_set(b"/a", b"1"),
    ]
    answers = []
    for size in (None, 1):  # whole frames (fast path), 1-byte pieces (generic path)
        conn, transport = _conn(StoreServer())
        for frame in frames:
            step = size or len(frame)
            for i in range(0, len(frame), step):
                conn.data_received(frame[i : i + step])
        answers.append(bytes(transport.out))
    assert answers[0] == answers[1] == P.encode_bytes(b"v") + b"\x00"
