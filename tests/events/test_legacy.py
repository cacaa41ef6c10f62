"""The older type-routed API, on the same machinery as destinations."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from aelastic import events
from aelastic.events import legacy
from aelastic.events._dispatch import arecord, flush, statistics
from aelastic.events._exceptions import EventFormatError
from aelastic.events._handlers import get_logging_handler


class Collect(legacy.EventHandler):
    def __init__(self) -> None:
        self.events: list[legacy.Event] = []

    def record(self, event: legacy.Event) -> None:
        self.events.append(event)


def test_event_fields_alias_and_json() -> None:
    event = legacy.Event("test_event", event_type="foo", metadata={"k": "v"}, timestamp=5)
    assert (event.name, event.type, event.event_type) == ("test_event", "foo", "foo")
    assert legacy.Event("x").type == "torchelastic"
    assert json.loads(event.serialize()) == {
        "name": "test_event",
        "type": "foo",
        "metadata": {"k": "v"},
        "timestamp": 5,
    }
    assert legacy.Event.deserialize(event.serialize()) == event
    with pytest.raises(EventFormatError):
        legacy.Event.deserialize("{}")
    with pytest.raises(ValueError, match="pass one"):
        legacy.Event("x", "a", event_type="b")


async def test_configure_routes_a_type_to_its_handler() -> None:
    handler = Collect()
    legacy.configure(handler, event_type="stdout_events")
    legacy.record_event(legacy.Event("a", "stdout_events"))
    before = int(time.time() * 1000)
    legacy.record("b", event_type="stdout_events", metadata={"x": 1})
    await flush()
    assert [e.name for e in handler.events] == ["a", "b"]
    assert handler.events[1].metadata == {"x": 1} and handler.events[1].timestamp >= before
    replacement = Collect()  # configure replaces, it does not add
    legacy.configure(replacement, event_type="stdout_events")
    legacy.record("c", event_type="stdout_events")
    await flush()
    assert [e.name for e in handler.events] == ["a", "b"]
    assert [e.name for e in replacement.events] == ["c"]


async def test_unconfigured_types_use_the_default_handler() -> None:
    default = Collect()
    legacy.configure(default)
    legacy.record("platform")  # type torchelastic
    legacy.record("other", event_type="never-configured")
    await flush()
    assert [(e.name, e.type) for e in default.events] == [
        ("platform", "torchelastic"),
        ("other", "never-configured"),
    ]
    legacy.configure(legacy.NullEventHandler())
    assert statistics()[""].handlers == 0  # null: recording costs nothing


async def test_builtin_destinations_are_types_and_subscribers_see_legacy_events() -> None:
    console = get_logging_handler("console")
    assert isinstance(console, logging.StreamHandler)
    old = console.setStream(io.StringIO())
    try:
        async with events.subscribe() as stream:
            legacy.record("printed", event_type="console", metadata={"k": 1})
            await flush()
            assert stream.receive_nowait().name == "printed"
    finally:
        written = console.setStream(old)
    assert written is not None
    assert '"name": "printed"' in written.getvalue()


async def test_console_and_async_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    legacy.configure(legacy.ConsoleEventHandler(), event_type="legacy-console")
    seen: list[str] = []

    class AsyncHandler(legacy.EventHandler):
        async def record(self, event: legacy.Event) -> None:
            seen.append(event.name)

    legacy.configure(AsyncHandler(), event_type="legacy-async")
    legacy.record("shown", event_type="legacy-console")
    await arecord(legacy.Event("awaited", "legacy-async"), "legacy-async")
    await flush()
    assert '"name": "shown"' in capsys.readouterr().out
    assert seen == ["awaited"]


def test_configure_rejects_non_handlers() -> None:
    with pytest.raises(TypeError, match="EventHandler"):
        legacy.configure(print)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        legacy.EventHandler()  # type: ignore[abstract]
