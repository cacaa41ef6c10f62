"""The node gate: real check commands and callables, a real rendezvous on a LocalStore."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic.nodes import NodeUnhealthyError
from aelastic.nodes._checks import (
    callable_check,
    command_check,
    free_memory_check,
    log_dir_check,
    nvml_check,
)
from aelastic.nodes._exceptions import NodeHealthConfigError
from aelastic.nodes._gate import NodeGate
from aelastic.nodes._policy import backoff_seconds
from aelastic.rendezvous._dynamic import DynamicRendezvousHandler
from aelastic.rendezvous._settings import DynamicSettings
from aelastic.store import LocalStore

FAST = DynamicSettings(join_timeout=10.0, close_timeout=2.0, read_timeout=5.0)


async def test_command_exit_status_and_output_tail_make_the_reason() -> None:
    gate = NodeGate([command_check("true"), command_check("echo disk gone >&2; exit 3")])
    report = await gate.check()
    assert not report.healthy and gate.kept_out
    assert [r.ok for r in report.results] == [True, False]
    assert report.reason() == "echo disk gone >&2; exit 3: FAILED (exit status 3: disk gone)"
    assert report.strikes == 1
    assert (await gate.check()).strikes == 2  # consecutive failed passes


async def test_hanging_command_is_timed_out_and_its_process_group_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    gate = NodeGate([command_check(f"sleep 60 & echo $! > {pid_file}; wait")], timeout=0.5)
    with anyio.fail_after(30):
        report = await gate.check()
    assert report.failed[0].detail == "timed out after 0.5 s (--node-health-timeout)"
    grandchild = int(pid_file.read_text())
    try:
        fd = os.pidfd_open(grandchild)
    except ProcessLookupError:
        return  # killed and reaped already
    try:
        with anyio.fail_after(10):  # readable once it exited: killed with its group
            await anyio.wait_readable(fd)
    finally:
        os.close(fd)


async def test_python_checks_fail_by_raising_or_returning_false() -> None:
    def broken() -> None:
        raise RuntimeError("ECC errors")

    async def fine() -> str:
        return "all good"

    gate = NodeGate(
        [
            callable_check("broken", broken),
            callable_check("false", lambda: False),
            callable_check("pair", lambda: (False, "NIC down")),
            callable_check("fine", fine),
        ]
    )
    report = await gate.check()
    assert [r.describe() for r in report.results] == [
        "broken: FAILED (raised RuntimeError: ECC errors)",
        "false: FAILED (returned False)",
        "pair: FAILED (NIC down)",
        "fine: ok (all good)",
    ]


async def test_builtin_checks(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemAvailable:  2048 kB\n")
    gate = NodeGate(
        [
            free_memory_check(1 << 20, str(meminfo)),  # 2 MiB available, 1 MiB needed
            free_memory_check(4 << 20, str(meminfo)),
            log_dir_check(str(tmp_path / "logs" / "new"), 1),
            log_dir_check(str(tmp_path), 1 << 62),
            log_dir_check(os.devnull, 1 << 62),
            nvml_check(),
        ]
    )
    results = (await gate.check()).results
    assert [r.ok for r in results] == [True, False, True, False, True, True]
    assert results[1].detail == "2 MiB available, need 4 MiB"
    assert results[2].detail.startswith(f"{tmp_path}: ")  # its nearest existing parent
    assert results[4].skipped and results[5].skipped  # no pynvml here: said so
    assert "NVML" in results[5].detail
    assert os.listdir(tmp_path) == ["meminfo"]  # the probe file is gone


def test_bad_settings_are_named() -> None:
    with pytest.raises(NodeHealthConfigError, match="empty command"):
        command_check("  ")
    with pytest.raises(NodeHealthConfigError, match="--node-health-timeout 0"):
        NodeGate([], timeout=0)


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_seconds(10, n, 60) for n in (1, 2, 3, 4)] == [10, 20, 40, 60]


async def test_unhealthy_node_stays_out_until_a_check_passes(tmp_path: Path) -> None:
    flag = tmp_path / "fixed"
    gate = NodeGate([command_check(f"test -e {flag}")], cooldown=0.2)
    events: list[tuple[str, Mapping[str, Any]]] = []

    def emit(name: str, metadata: Mapping[str, Any]) -> None:
        events.append((name, metadata))
        if len(events) == 2:
            flag.touch()  # repaired after the second failed pass

    async with DynamicRendezvousHandler("h", 1, 1, FAST, store=LocalStore()) as handler:
        with anyio.fail_after(30):
            await gate.admit(handler, emit)
        assert [name for name, _ in events] == [
            "aelastic.node.unhealthy",
            "aelastic.node.unhealthy",
            "aelastic.node.healthy",
        ]
        assert events[1][1]["strikes"] == 2 and events[1][1]["checks"] == f"test -e {flag}"
        assert not gate.kept_out
        info = await handler.next_rendezvous()  # and it joins
        assert info.world_size == 1


async def test_unhealthy_node_exits_once_the_job_ends_without_it() -> None:
    store = LocalStore()
    gate = NodeGate([command_check("exit 1")], cooldown=60)
    async with (
        DynamicRendezvousHandler("e", 1, 2, FAST, store=store) as sick,
        DynamicRendezvousHandler("e", 1, 2, FAST, store=store) as peer,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(peer.set_closed)  # the job ends (its last node closes it)
        with anyio.fail_after(30), pytest.raises(NodeUnhealthyError) as caught:
            await gate.admit(sick, lambda name, md: None)
    assert caught.value.failed == ("exit 1",)
    assert "exit 1: FAILED (exit status 1)" in str(caught.value)
    assert "its rendezvous was closed" in str(caught.value)
