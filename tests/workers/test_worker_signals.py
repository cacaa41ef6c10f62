"""parse_signals and open_signal_forwarder (the CLI path)."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from aelastic.workers._signals import (
    DEFAULT_SIGNALS_TO_HANDLE,
    open_signal_forwarder,
    parse_signals,
)


def test_parse_signals() -> None:
    assert parse_signals(DEFAULT_SIGNALS_TO_HANDLE) == (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )
    assert parse_signals(" sigusr1 , USR2,15") == (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
    with pytest.raises(ValueError, match="unknown signal 'SIGFOO'"):
        parse_signals("SIGTERM,SIGFOO")
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        parse_signals("SIGKILL")
    with pytest.raises(ValueError, match="twice"):
        parse_signals("SIGTERM,15")
    with pytest.raises(ValueError, match="no signal"):
        parse_signals(" , ")


async def test_forwarder_calls_back_and_restores_handler() -> None:
    received: list[signal.Signals] = []
    got = anyio.Event()

    async def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        got.set()

    before = signal.getsignal(signal.SIGUSR1)
    async with open_signal_forwarder([signal.SIGUSR1], on_signal):
        os.kill(os.getpid(), signal.SIGUSR1)
        with anyio.fail_after(10):
            await got.wait()
    assert received == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) == before
