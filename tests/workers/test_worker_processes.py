"""open_worker_processes with real subprocesses: exits, stop, signals, cleanup.

Every test runs on asyncio, uvloop and trio (anyio's plugin) with both exit watchers.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from aelastic.workers import ProcessSpec, WorkerStartError, open_worker_processes
from aelastic.workers._exceptions import NoMoreExitsError
from aelastic.workers._procfs import process_state
from aelastic.workers._std import Std

from .conftest import Reporter, open_fds, pid_gone, py, wait_gone

pytestmark = pytest.mark.anyio

PAUSE = "import signal\nsignal.pause()\n"


@pytest.fixture(autouse=True, params=["pidfd", "thread"])
def watcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run every test with both exit watchers (pidfd, a thread blocked in waitid)."""
    name: str = request.param
    if name == "pidfd" and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this platform")
    monkeypatch.setenv("AELASTIC_CHILD_WATCHER", name)
    return name


def spec(rank: int, args: list[str], env: dict[str, str] | None = None) -> ProcessSpec:
    return ProcessSpec(local_rank=rank, args=args, env=env or dict(os.environ))


async def test_exit_is_noticed_while_others_run(reporter: Reporter) -> None:
    specs = [
        spec(0, py("report('up')\n" + PAUSE), reporter.env()),
        spec(1, py("import sys\nsys.exit(3)"), reporter.env()),
    ]
    async with open_worker_processes(specs, shutdown_timeout=10) as workers:
        assert set(workers.pids) == {0, 1}
        with anyio.fail_after(10):
            first = await workers.wait_for_exit()
        assert (first.local_rank, first.exitcode, first.failed) == (1, 3, True)
        assert first.signal_name is None
        assert await reporter.receive() == "up"
        assert workers.is_alive(0) and not workers.is_alive(1)
        assert list(workers.failures()) == [1]
    # Leaving the block stopped rank 0 with SIGTERM.
    assert workers.exits[0].exitcode == -signal.SIGTERM
    assert workers.exits[0].signal_name == "SIGTERM"
    assert (await workers.wait_for_exit()).local_rank == 0
    with pytest.raises(NoMoreExitsError):
        await workers.wait_for_exit()


async def test_wait_all_and_no_more_exits() -> None:
    specs = [spec(r, [sys.executable, "-c", f"raise SystemExit({r})"]) for r in range(3)]
    async with open_worker_processes(specs) as workers:
        with anyio.fail_after(20):
            exits = await workers.wait_all()
            assert {r: e.exitcode for r, e in exits.items()} == {0: 0, 1: 1, 2: 2}
            got = {(await workers.wait_for_exit()).local_rank for _ in range(3)}
        assert got == {0, 1, 2}
        with pytest.raises(NoMoreExitsError):
            await workers.wait_for_exit()


async def test_stop_sigterm_is_honoured(reporter: Reporter) -> None:
    async with open_worker_processes([spec(0, py("report('up')\n" + PAUSE), reporter.env())]) as w:
        await reporter.receive()
        with anyio.fail_after(10):
            exits = await w.stop(signal.SIGTERM, timeout=30)
        assert exits[0].exitcode == -signal.SIGTERM
        assert not w.unreaped


async def test_worker_ignoring_sigterm_is_killed_after_timeout(reporter: Reporter) -> None:
    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nreport('ready')\n"
    specs = [spec(r, py(code + PAUSE), reporter.env()) for r in range(2)]
    async with open_worker_processes(specs) as w:
        assert await reporter.receive() == "ready"
        assert await reporter.receive() == "ready"
        start = anyio.current_time()
        with anyio.fail_after(15):
            exits = await w.stop(signal.SIGTERM, timeout=0.5)
        elapsed = anyio.current_time() - start
    assert {e.exitcode for e in exits.values()} == {-signal.SIGKILL}
    assert exits[0].signal_name == "SIGKILL"
    # One shared deadline for both workers, not one per worker.
    assert 0.5 <= elapsed < 5


async def test_grandchildren_in_the_group_are_killed(reporter: Reporter) -> None:
    code = textwrap.dedent(
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        report(child.pid)
        """
    )
    async with open_worker_processes([spec(0, py(code + PAUSE), reporter.env())]) as w:
        grandchild = int(await reporter.receive())
        assert not pid_gone(grandchild)
        worker = w.pids[0]
    assert pid_gone(worker)
    await wait_gone(grandchild)


async def test_leftover_grandchild_of_an_exited_worker_is_killed(reporter: Reporter) -> None:
    # Both watchers leave the exited leader a zombie, so its group id stays ours to signal.
    code = textwrap.dedent(
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        report(child.pid)
        """
    )
    async with open_worker_processes([spec(0, py(code), reporter.env())]) as w:
        grandchild = int(await reporter.receive())
        with anyio.fail_after(10):
            assert (await w.wait_for_exit()).exitcode == 0
        assert not pid_gone(grandchild)
    await wait_gone(grandchild)


async def test_send_signal_forwards_to_the_group(reporter: Reporter) -> None:
    code = textwrap.dedent(
        """
        import signal, sys
        signal.signal(signal.SIGUSR1, lambda *a: sys.exit(42))
        report('ready')
        """
    )
    async with open_worker_processes([spec(0, py(code + PAUSE), reporter.env())]) as w:
        await reporter.receive()
        w.send_signal(signal.SIGUSR1)
        with anyio.fail_after(10):
            assert (await w.wait_for_exit()).exitcode == 42


async def test_cancellation_stops_reaps_and_leaks_no_fd(reporter: Reporter) -> None:
    before = open_fds()
    pids: dict[int, int] = {}
    with anyio.CancelScope() as scope:
        specs = [spec(r, py("report('up')\n" + PAUSE), reporter.env()) for r in range(2)]
        async with open_worker_processes(specs, shutdown_timeout=10) as w:
            pids = dict(w.pids)
            await reporter.receive()
            await reporter.receive()
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert {e.exitcode for e in w.exits.values()} == {-signal.SIGTERM}
    for pid in pids.values():
        assert not await anyio.Path(f"/proc/{pid}").exists(), "worker not reaped"
    assert open_fds() == before


async def test_error_in_block_stops_workers_and_propagates(reporter: Reporter) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with open_worker_processes([spec(0, py("report('up')\n" + PAUSE), reporter.env())]):
            await reporter.receive()
            raise RuntimeError("boom")


async def test_start_failure_is_clear_and_stops_started_workers(reporter: Reporter) -> None:
    specs = [
        spec(0, py("report('up')\n" + PAUSE), reporter.env()),
        spec(1, ["/nonexistent/aelastic-binary"]),
    ]
    before = open_fds()
    with pytest.raises(WorkerStartError, match="local rank 1"):
        async with open_worker_processes(specs):
            pytest.fail("must not enter the block")
    assert open_fds() == before


async def test_bad_specs_are_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        async with open_worker_processes([spec(0, ["true"]), spec(0, ["true"])]):
            pass
    with pytest.raises(ValueError, match="argv"):
        async with open_worker_processes([ProcessSpec(0, "true", {})]):
            pass


async def test_bad_watcher_setting_is_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AELASTIC_CHILD_WATCHER", "poll")
    with pytest.raises(ValueError, match="pidfd, thread"):
        async with open_worker_processes([spec(0, ["true"])]):
            pass


async def test_states_reads_proc(reporter: Reporter) -> None:
    async with open_worker_processes([spec(0, py("report('up')\n" + PAUSE), reporter.env())]) as w:
        await reporter.receive()
        assert w.states()[0] in ("R", "S")  # on its way into pause()
        assert process_state(w.pids[0]) in ("R", "S")
    assert w.states() == {}
    assert process_state(2**22 + 1) is None


async def test_script_without_exec_permission_is_clear(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(WorkerStartError, match=r"local rank 0.*(not executable|Permission)"):
        async with open_worker_processes([spec(0, [str(script)])]):
            pass


async def test_cancellation_with_pipes_and_log_files_leaks_no_fd(
    reporter: Reporter, tmp_path: Path
) -> None:
    before = open_fds()
    with anyio.CancelScope() as scope:
        specs = [
            ProcessSpec(
                r,
                py("print('hello', flush=True)\nreport('up')\n" + PAUSE),
                reporter.env(),
                stdout_file=str(tmp_path / f"{r}.out"),
                stderr_file=str(tmp_path / f"{r}.err"),
                tee=Std.OUT,
                console_prefix=f"[w{r}]:",
                show_on_console=r == 0,
            )
            for r in range(2)
        ]
        async with open_worker_processes(specs, shutdown_timeout=10):
            await reporter.receive()
            await reporter.receive()
            scope.cancel()
            await anyio.sleep_forever()
    assert open_fds() == before
    assert (await anyio.Path(tmp_path / "1.out").read_text()) == "hello\n"


def _children() -> set[str]:
    """Pids of this process's children, zombies included (Linux >= 3.5)."""
    found: set[str] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as fp:
                found.update(fp.read().split())
        except FileNotFoundError:
            continue  # the thread ended since the listing (a pool thread, an events hop)
    return found


async def test_cancelled_while_starting_leaves_no_process_or_fd(reporter: Reporter) -> None:
    # Starting forks one worker per loop turn: a cancellation can land between two forks.
    before, children = open_fds(), _children()
    specs = [spec(r, py(f"report({r})\n" + PAUSE), reporter.env()) for r in range(3)]
    with anyio.move_on_after(0) as scope:  # cancelled at the first checkpoint: after rank 0
        async with open_worker_processes(specs, shutdown_timeout=10):
            pytest.fail("the block must not run")
    assert scope.cancelled_caught
    assert _children() == children  # every worker started was stopped and reaped
    assert open_fds() == before


async def test_large_output_reaches_the_log_file_whole(tmp_path: Path) -> None:
    # 4 MiB through the agent's pipe reader (tee'd to the console, so piped), in bursts
    # larger than a pipe and than one read: every byte lands in the file, in order.
    code = (
        "import sys\nfor i in range(64):\n    sys.stdout.write(f'{i:05d}' + 'x' * 65530 + '\\n')\n"
    )
    out = tmp_path / "0.out"
    worker = ProcessSpec(
        0,
        [sys.executable, "-c", code],
        dict(os.environ),
        stdout_file=str(out),
        tee=Std.OUT,  # file and console: the agent reads the pipe and writes both
    )
    async with open_worker_processes([worker]) as w:
        with anyio.fail_after(60):
            assert (await w.wait_for_exit()).exitcode == 0
    lines = (await anyio.Path(out).read_text()).splitlines()
    assert [line[:5] for line in lines] == [f"{i:05d}" for i in range(64)]
    assert all(len(line) == 65535 for line in lines)
