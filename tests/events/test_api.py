"""The current API: event objects, JSON, destinations, stdlib logging, rdzv events."""

from __future__ import annotations

import io
import json
import logging
import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aelastic import AelasticError, events
from aelastic.events import Event, EventSource, NodeState, RdzvEvent
from aelastic.events._dispatch import arecord, flush, flush_blocking, statistics
from aelastic.events._event import EventMetadataValue
from aelastic.events._exceptions import EventFormatError, UnknownDestinationError
from aelastic.events._handlers import get_logging_handler
from aelastic.events._record import construct_and_record_rdzv_event

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.text(max_size=20),
    st.floats(allow_nan=False, allow_infinity=False),
)


def test_event_json_has_torchs_shape() -> None:
    event = Event("torchelastic.worker.status.START", EventSource.WORKER, 12, {"rank": 0})
    assert json.loads(event.serialize()) == {
        "name": "torchelastic.worker.status.START",
        "source": "WORKER",
        "timestamp": 12,
        "metadata": {"rank": 0},
    }
    assert str(event) == event.serialize()
    assert Event("x", EventSource.AGENT).timestamp == 0
    assert Event("x", EventSource.AGENT).metadata == {}


@given(
    name=st.text(max_size=30),
    ts=st.integers(0, 2**62),
    meta=st.dictionaries(st.text(max_size=10), _scalars, max_size=5),
)
def test_event_round_trip(name: str, ts: int, meta: dict[str, EventMetadataValue]) -> None:
    for source in EventSource:
        event = Event(name, source, ts, meta)
        back = Event.deserialize(event.serialize())
        assert back == event and back.source is source
        assert Event.deserialize(event) is event


def test_rdzv_event_round_trip() -> None:
    event = RdzvEvent("f.py:join", "run", "joined", "host", 42, NodeState.FAILED, "h:1", 3, 0, "tb")
    data = json.loads(event.serialize())
    assert list(data) == [
        "name",
        "run_id",
        "message",
        "hostname",
        "pid",
        "node_state",
        "master_endpoint",
        "rank",
        "local_id",
        "error_trace",
    ]
    assert data["node_state"] == "FAILED"
    assert RdzvEvent.deserialize(event.serialize()) == event
    assert RdzvEvent.deserialize(event.serialize().encode()) == event
    assert RdzvEvent.deserialize(event) is event


@pytest.mark.parametrize(
    "bad", ["not json", "[1]", '{"name": "x"}', '{"name": "x", "source": "NOPE"}']
)
def test_deserialize_bad_input_is_one_clear_error(bad: str) -> None:
    with pytest.raises(EventFormatError, match="Event"):
        Event.deserialize(bad)
    with pytest.raises(AelasticError):
        RdzvEvent.deserialize(bad)


def test_enums() -> None:
    assert [s.value for s in EventSource] == ["AGENT", "WORKER"]
    assert [s.value for s in NodeState] == ["INIT", "RUNNING", "SUCCEEDED", "FAILED"]
    assert EventSource.AGENT == "AGENT"


def test_logging_handlers_and_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(get_logging_handler(), logging.NullHandler)
    assert isinstance(get_logging_handler("null"), logging.NullHandler)
    assert isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler)
    console = get_logging_handler("console")
    assert type(console) is logging.StreamHandler
    with pytest.raises(UnknownDestinationError, match="'nowhere'"):
        get_logging_handler("nowhere")
    # the console handler's stream is the one sys.stderr was when it was made; the
    # test reads the line there instead of printing it into pytest's output
    shown = io.StringIO()
    monkeypatch.setattr(console, "stream", shown)
    event = Event("x", EventSource.AGENT)
    events.record(event, "console")
    assert flush_blocking(10)
    assert shown.getvalue().splitlines() == [event.serialize()]
    logger = logging.getLogger("aelastic-events-console")
    assert logger.propagate is False
    assert console in logger.handlers
    assert logger.level == logging.getLevelName(os.environ.get("LOGLEVEL", "INFO"))


def test_unknown_destination_names_the_fix() -> None:
    with pytest.raises(UnknownDestinationError, match=r"register_handler\('nowhere'"):
        events.record(Event("x", EventSource.AGENT), "nowhere")


def test_null_destination_does_nothing() -> None:
    before = statistics().get("null")
    for _ in range(10):
        events.record(Event("x", EventSource.AGENT))
    after = statistics()["null"]
    assert after.queued == 0 and after.processed == (before.processed if before else 0)


async def test_logging_handler_destination_gets_serialized_events() -> None:
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    events.register_handler("captured", Capture())
    sent = [Event(f"e{i}", EventSource.AGENT, i) for i in range(5)]
    for event in sent:
        events.record(event, "captured")
    await flush()
    assert records == [e.serialize() for e in sent]
    assert isinstance(logging.getLogger("aelastic-events-captured").handlers[0], Capture)


def _join_rendezvous() -> None:
    construct_and_record_rdzv_event("run-1", "joining", NodeState.RUNNING, rank=2)


async def test_rdzv_event_names_caller_and_fills_host_pid() -> None:
    async with events.subscribe("dynamic_rendezvous") as stream:
        _join_rendezvous()
        construct_and_record_rdzv_event(
            "run-1",
            "named",
            NodeState.INIT,
            name="Handler.next",
            hostname="h",
            pid=7,
            master_endpoint="m:1",
            local_id=3,
        )
        first, second = stream.receive_nowait(), stream.receive_nowait()
    assert first == RdzvEvent(
        name="test_api.py:_join_rendezvous",
        run_id="run-1",
        message="joining",
        hostname=socket.getfqdn(),
        pid=os.getpid(),
        node_state=NodeState.RUNNING,
        rank=2,
    )
    assert second.name == "test_api.py:Handler.next"
    assert (second.hostname, second.pid, second.master_endpoint, second.local_id) == (
        "h",
        7,
        "m:1",
        3,
    )


async def test_failed_rdzv_event_carries_the_traceback() -> None:
    async with events.subscribe("dynamic_rendezvous") as stream:
        try:
            raise RuntimeError("store vanished")
        except RuntimeError:
            construct_and_record_rdzv_event("r", "failed", NodeState.FAILED)
        event = stream.receive_nowait()
    assert "RuntimeError: store vanished" in event.error_trace
    assert event.name.endswith(":test_failed_rdzv_event_carries_the_traceback")


def test_rdzv_event_does_no_work_with_only_a_null_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> str:
        raise AssertionError("built an event although nobody listens")

    monkeypatch.setattr(socket, "getfqdn", boom)
    monkeypatch.setattr(events._record, "_hostname", None)
    construct_and_record_rdzv_event("r", "m", NodeState.INIT)


async def test_record_rdzv_event_reaches_registered_handler() -> None:
    seen: list[RdzvEvent] = []
    events.register_handler("dynamic_rendezvous", seen.append)
    event = RdzvEvent("a:b", "r", "m", "h", 1, NodeState.SUCCEEDED)
    events.record_rdzv_event(event)
    await arecord(event, "dynamic_rendezvous")
    assert seen == [event, event]


def test_bad_handler_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"logging\.Handler"):
        events.register_handler("x", 42)


async def test_each_logging_handler_gets_each_event_once() -> None:
    first: list[str] = []
    second: list[str] = []

    class Capture(logging.Handler):
        def __init__(self, into: list[str]) -> None:
            super().__init__()
            self.into = into

        def emit(self, record: logging.LogRecord) -> None:
            self.into.append(record.getMessage())

    events.register_handler("two-loggers", Capture(first))
    events.register_handler("two-loggers", Capture(second))
    events.register_handler("two-loggers", lambda e: None)
    await arecord(Event("once", EventSource.AGENT), "two-loggers")
    assert len(first) == len(second) == 1
