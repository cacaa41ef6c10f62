"""A console nobody reads never stalls the agent, its workers or their log files."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aelastic.workers import _console
from aelastic.workers._console import ConsoleLogHandler, ConsoleWriter, wait_consoles_written
from aelastic.workers._output import Sink

from .conftest import Reporter

#: Each worker prints this many 100-byte lines (2 MB), then (with a reporter) says so and waits.
LINES = 20_000
WORKER = """
import os, signal, socket, sys
line = "x" * 99 + "\\n"
for _ in range(LINES):
    sys.stdout.write(line)
sys.stdout.flush()
if os.environ.get("AELASTIC_TEST_REPORT"):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AELASTIC_TEST_REPORT"])
    s.sendall(("printed " + os.environ["LOCAL_RANK"] + "\\n").encode())
    s.close()
    signal.pause()
""".replace("LINES", str(LINES))


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe's read and write ends; a test that never reads it has a stalled console."""
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        os.close(w)
        os.close(r)


@pytest.fixture
def stalled_pipe(pipe: tuple[int, int]) -> int:
    """The write end of a pipe whose read end stays open and is never read."""
    return pipe[1]


def launch(
    tmp_path: Path, stdout: int, env: dict[str, str], stderr_too: bool = False
) -> subprocess.Popen[bytes]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "2"]
    argv += ["--tee", "3", "--log-dir", str(tmp_path / "logs"), str(script)]
    stderr = open(tmp_path / "launcher.err", "wb")  # noqa: SIM115 (closed below)
    try:
        return subprocess.Popen(
            argv, stdout=stdout, stderr=stdout if stderr_too else stderr, env=env
        )
    finally:
        stderr.close()


def log_sizes(tmp_path: Path) -> list[int]:
    return sorted(p.stat().st_size for p in (tmp_path / "logs").rglob("stdout.log"))


async def wait_exit(proc: subprocess.Popen[bytes], limit: float) -> int:
    with anyio.fail_after(limit):
        return await anyio.to_thread.run_sync(proc.wait)


async def test_stalled_console_neither_blocks_workers_nor_truncates_logs(
    tmp_path: Path, stalled_pipe: int
) -> None:
    proc = launch(tmp_path, stalled_pipe, dict(os.environ))
    try:
        # Before the fix the agent blocked in its console write until the pipe broke.
        assert await wait_exit(proc, 60) == 0, (tmp_path / "launcher.err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert log_sizes(tmp_path) == [LINES * 100, LINES * 100]
    err = (tmp_path / "launcher.err").read_text()
    assert "were dropped from the console (stdout)" in err
    assert err.count("dropped from the console") == 1


async def test_stalled_stdout_and_stderr_do_not_hang_the_exit(
    tmp_path: Path, stalled_pipe: int
) -> None:
    # `aelastic run ... 2>&1 | collector`: the drop report itself must not wait on the pipe.
    proc = launch(tmp_path, stalled_pipe, dict(os.environ), stderr_too=True)
    try:
        assert await wait_exit(proc, 60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert log_sizes(tmp_path) == [LINES * 100, LINES * 100]


async def test_sigterm_is_handled_while_the_console_is_stalled(
    tmp_path: Path, stalled_pipe: int, reporter: Reporter
) -> None:
    proc = launch(tmp_path, stalled_pipe, reporter.env())
    try:
        # Both workers printed everything: the agent kept reading their pipes.
        got = {await reporter.receive(60), await reporter.receive(60)}
        assert got == {"printed 0", "printed 1"}
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc, 20) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert log_sizes(tmp_path) == [LINES * 100, LINES * 100]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_full_console_drops_the_oldest_whole_lines(
    backend: str, pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.FileIO(w, "wb", closefd=False)))
    writer = ConsoleWriter("stdout", limit=1 << 16)
    count = 10_000
    lines = [b"%06d" % i + b"." * 93 + b"\n" for i in range(count)]  # 100 bytes each

    async def main() -> None:
        for line in lines:  # 1 MB into a 64 KiB pipe: would block without the queue
            writer.write(line)
        with anyio.fail_after(20):  # returns once the console is seen stalled
            while not await anyio.to_thread.run_sync(writer.wait_done, writer.enqueued, 1.0):
                pass
            await wait_consoles_written()

    anyio.run(main, backend=backend)
    assert writer.stalled()
    assert writer.enqueued == count * 100
    assert writer.dropped > count * 100 - 4 * (1 << 16)
    # Now read the console: what was written or in flight before the stall and the
    # newest lines (queued meanwhile) arrive whole and in order; the dropped ones are
    # the oldest of those queued.
    expected = writer.enqueued - writer.dropped
    received = bytearray()
    while len(received) < expected:  # pytest-timeout guards a writer that never sends
        received += os.read(r, 1 << 16)
    assert writer.wait_done(writer.enqueued, 20)
    shown = bytes(received).splitlines()
    assert all(len(line) == 99 for line in shown)
    got = [int(line[:6]) for line in shown]
    assert got == sorted(set(got))
    assert len(got) * 100 == expected
    newest = got.index(count - 1 - (1 << 16) // 100 + 1)
    assert got[newest:] == list(range(got[newest], count))


def test_sink_feeds_files_whole_when_the_console_is_full(
    tmp_path: Path, pipe: tuple[int, int], stalled_pipe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = io.TextIOWrapper(io.FileIO(stalled_pipe, "wb", closefd=False))
    monkeypatch.setattr(sys, "stdout", console)
    # This test's console writer stays stuck on the pipe: keep it from later tests.
    monkeypatch.setattr(_console, "_writers", {})
    path = tmp_path / "out.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        sink = Sink(fd, "stdout", b"[p]:")
        data = b"y" * 99 + b"\n"
        done = threading.Event()

        def feed() -> None:
            for _ in range(50_000):  # 5 MB: more than the pipe and the console's queue
                sink.feed(data)
            sink.finish()
            done.set()

        thread = threading.Thread(target=feed, daemon=True)
        thread.start()
        assert done.wait(60), "Sink.feed blocked on a stalled console"
    finally:
        os.close(fd)
    assert path.stat().st_size == 50_000 * 100
    # Let the console writer write out what it kept, so that no thread of this test
    # writes into a later test's sys.stdout (the writer looks the stream up at each
    # write: under xdist a later test's pipe once got these lines). wait_done() returns
    # at once while the writer is stalled, so it is asked until every byte is done.
    writer = _console._writers["stdout"]
    drained = threading.Event()

    def drain() -> None:
        while not drained.is_set():
            os.read(pipe[0], 1 << 16)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    deadline = time.monotonic() + 60
    while writer.done < writer.enqueued:
        assert time.monotonic() < deadline, "the console writer never wrote out its queue"
        writer.wait_done(writer.enqueued, 1)
    # and the drain thread ends before the fixture closes the pipe, whose descriptor
    # numbers a later test's pipe may get
    drained.set()
    os.write(pipe[1], b"\n")
    drainer.join(60)
    assert not drainer.is_alive()


def test_a_broken_console_is_skipped_until_sys_stdout_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r, w = os.pipe()
    os.close(r)  # every write now fails with EPIPE
    try:
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.FileIO(w, "wb", closefd=False)))
        writer = ConsoleWriter("stdout")
        assert writer.wait_done(writer.write(b"lost\n"), 20)
        assert writer.wait_done(writer.write(b"skipped\n"), 20)
    finally:
        os.close(w)
    r2, w2 = os.pipe()
    try:
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.FileIO(w2, "wb", closefd=False)))
        assert writer.wait_done(writer.write(b"shown\n"), 20)
        assert os.read(r2, 100) == b"shown\n"
    finally:
        os.close(r2)
        os.close(w2)


def test_a_live_console_gets_every_line_in_order(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.FileIO(w, "wb", closefd=False)))
    writer = ConsoleWriter("stdout", limit=1 << 30)
    count = 50_000
    received = bytearray()

    def read() -> None:
        while len(received) < count * 10:
            received.extend(os.read(r, 1 << 16))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for i in range(count):  # small writes: the writer thread starts, idles, wakes many times
        writer.write(b"%09d\n" % i)
    assert writer.wait_done(writer.enqueued, 60)
    reader.join(60)
    assert writer.dropped == 0
    assert bytes(received) == b"".join(b"%09d\n" % i for i in range(count))


def test_log_handler_never_blocks_on_a_stalled_console(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(io.FileIO(w, "wb", closefd=False)))
    monkeypatch.setattr(_console, "_writers", {})  # this test's writer stays stuck on the pipe
    logger = logging.getLogger("aelastic.test.console")
    handler = ConsoleLogHandler("stderr")
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("first")
        assert _console.console_writer("stderr").wait_done(1, 20)
        assert os.read(r, 100) == b"[WARNING] first\n"
        _console.console_writer("stderr").limit = 1 << 16
        for _ in range(20_000):  # 1.4 MB of records into a 64 KiB pipe nobody reads now
            logger.warning("x" * 60)
        assert _console.console_writer("stderr").dropped > 0
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
