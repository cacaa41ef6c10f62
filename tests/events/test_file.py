"""The ``file`` destination: JSON lines, path from configure_file() or the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from aelastic import events
from aelastic.events import Event, EventSource
from aelastic.events._dispatch import arecord, flush
from aelastic.events._handlers import get_logging_handler


async def test_configure_file_writes_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    handler = events.configure_file(path)
    assert get_logging_handler("file") is handler
    sent = [Event(f"e{i}", EventSource.AGENT, i, {"i": i}) for i in range(1000)]
    for event in sent:
        events.record(event, "file")
    await flush()
    lines = path.read_text().splitlines()
    assert [Event.deserialize(line) for line in lines] == sent
    other = tmp_path / "other.jsonl"
    events.configure_file(other)  # replaces the previous file
    await arecord(sent[0], "file")
    assert len(path.read_text().splitlines()) == 1000
    assert other.read_text().splitlines() == [sent[0].serialize()]


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_file_from_environment_flushed_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "env.jsonl"
    out = _run(
        "from aelastic import events\n"
        "for i in range(100):\n"
        "    events.record(events.Event(f'e{i}', events.EventSource.WORKER), 'file')\n",
        {"AELASTIC_EVENTS_FILE": str(path)},
    )
    assert out.returncode == 0, out.stderr
    assert [Event.deserialize(x).name for x in path.read_text().splitlines()] == [
        f"e{i}" for i in range(100)
    ]


def test_file_without_path_is_one_clear_error() -> None:
    out = _run(
        "from aelastic import events\n"
        "try:\n"
        "    events.record(events.Event('e', events.EventSource.WORKER), 'file')\n"
        "except events.EventsError as exc:\n"
        "    print(exc)\n",
        {"AELASTIC_EVENTS_FILE": ""},
    )
    assert "configure_file(path) or set AELASTIC_EVENTS_FILE" in out.stdout, out.stderr


def test_package_imports_without_torch() -> None:
    out = _run(
        "import sys\n"
        "import aelastic.events, aelastic.events.legacy, aelastic.events._cli, aelastic.metrics\n"
        "from aelastic.metrics._prometheus import PrometheusMetricHandler\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'prometheus_client' not in sys.modules, 'prometheus imported eagerly'\n",
        {},
    )
    assert out.returncode == 0, out.stderr
