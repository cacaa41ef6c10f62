"""The supervised torchft Lighthouse, the user's Lighthouse check, and the flags."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.launcher._args import parse_run_args
from aelastic.launcher._exceptions import UsageError
from aelastic.replicas import LighthouseError
from aelastic.replicas._exceptions import ReplicaGroupConfigError
from aelastic.replicas._lighthouse import check_lighthouse, lighthouse_binary, open_lighthouse
from aelastic.replicas._settings import LighthouseSettings

pytest.importorskip("torchft")
pytestmark = pytest.mark.anyio


async def test_the_lighthouse_is_restarted_on_its_port_when_it_dies(tmp_path: Path) -> None:
    settings = LighthouseSettings(log_path=str(tmp_path / "lighthouse.log"))
    async with open_lighthouse(settings) as lighthouse:
        url, first = lighthouse.url, lighthouse.pid
        await check_lighthouse(url)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(30):
            await lighthouse.wait_started(2)
        assert lighthouse.url == url and lighthouse.pid != first
        assert [code for _, code in lighthouse.restarts] == [-signal.SIGKILL]
        await check_lighthouse(url)
        pid = lighthouse.pid
    assert pid is not None
    with pytest.raises(ProcessLookupError):  # stopped (and reaped) on leaving
        os.kill(pid, 0)
    assert "Lighthouse listening on" in (tmp_path / "lighthouse.log").read_text()
    with pytest.raises(LighthouseError, match="start torchft_lighthouse there"):
        await check_lighthouse(url, within=5)


async def test_a_lighthouse_that_cannot_start_is_one_clear_error() -> None:
    settings = LighthouseSettings(host="192.0.2.1")  # TEST-NET: not this machine's
    with anyio.fail_after(60), pytest.raises(LighthouseError, match="exited before listening"):
        async with open_lighthouse(settings):
            pytest.fail("entered without a Lighthouse")


async def test_an_address_where_nothing_answers_is_one_clear_error() -> None:
    with anyio.fail_after(30):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        await listener.aclose()  # nothing listens there now
        expected = rf"--lighthouse http://127.0.0.1:{port}: Connection refused; start"
        with pytest.raises(LighthouseError, match=expected):
            await check_lighthouse(f"http://127.0.0.1:{port}")


@pytest.mark.parametrize(
    "url", ["127.0.0.1:29510", "grpc://h:1", "http://h", "http://h:port", "http://h:1/x"]
)
def test_a_bad_lighthouse_url_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="--lighthouse"):
        parse_run_args(["--replica-groups", "2", "--lighthouse", url, "t.py"], {})


def test_missing_torchft_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ReplicaGroupConfigError, match=r"pip install 'aelastic\[torchft\]'"):
        lighthouse_binary()


def test_replica_group_flags_and_their_environment_variables() -> None:
    parsed = parse_run_args(["--replica-groups", "3", "t.py"], {})
    assert parsed.replica_groups is not None
    assert parsed.replica_groups.local_groups() == [0, 1, 2]
    assert parsed.replica_groups.lighthouse is None
    assert parsed.config.preload.modules == ("auto",)  # a restarted group skips its imports
    env = {"PET_REPLICA_GROUPS": "4", "PET_REPLICA_GROUP_ID": "2", "PET_LIGHTHOUSE": "http://h:9"}
    flags = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--nnodes", "2", "t.py"]
    groups = parse_run_args(flags, env).replica_groups
    assert groups is not None
    assert (groups.groups, groups.local_groups(), groups.lighthouse) == (4, [2], "http://h:9")
    assert parse_run_args(["t.py"], {}).replica_groups is None
    # many nodes on c10d without --lighthouse: the store's host starts one
    flags = ["--replica-groups", "2", "--replica-group-id", "1", *flags]
    groups = parse_run_args(flags, {}).replica_groups
    assert groups is not None and groups.lighthouse is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replica-groups", "0"], "must be >= 1"),
        (["--replica-groups", "2", "--replica-group-id", "2", "--lighthouse", "http://h:1"],
         "must be 0..1"),
        (["--replica-group-id", "1"], "needs --replica-groups"),
        (["--replica-groups", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1"],
         "give --replica-group-id"),
        (["--replica-groups", "2", "--replica-group-id", "1"], "give --lighthouse"),
        (["--replica-groups", "2", "--replica-group-id", "1", "--rdzv-backend", "etcd",
          "--rdzv-endpoint", "h:1"], "etcd: .* give --lighthouse"),
        (["--replica-groups", "2", "--lighthouse-heartbeat-timeout", "0"], "must be > 0"),
    ],
)  # fmt: skip
def test_bad_replica_group_flags_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_run_args([*argv, "t.py"], {})
