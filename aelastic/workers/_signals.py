"""Signals the CLI traps and forwards to workers (``--signals-to-handle``)."""

from __future__ import annotations

import contextlib
import inspect
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import anyio

from .._exceptions import ConfigError

__all__ = ("DEFAULT_SIGNALS_TO_HANDLE", "open_signal_forwarder", "parse_signals")

#: torchrun's default ``--signals-to-handle``.
DEFAULT_SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

_UNCATCHABLE = {"SIGKILL", "SIGSTOP"}


def parse_signals(value: str) -> tuple[signal.Signals, ...]:
    """Parse ``"SIGTERM,SIGINT,SIGUSR1"`` (names, ``SIG`` optional, or numbers).

    Raises ValueError naming the bad entry: unknown names, uncatchable signals
    (SIGKILL, SIGSTOP), duplicates or an empty list.
    """
    result: list[signal.Signals] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            if item.isdigit():
                sig = signal.Signals(int(item))
            else:
                name = item.upper()
                sig = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        except (KeyError, ValueError):
            raise ConfigError(
                f"unknown signal {item!r} in {value!r}; use names such as"
                f" {DEFAULT_SIGNALS_TO_HANDLE},SIGUSR1,SIGUSR2"
            ) from None
        if sig.name in _UNCATCHABLE:
            raise ConfigError(f"{sig.name} cannot be caught or forwarded; remove it from {value!r}")
        if sig in result:
            raise ConfigError(f"signal {sig.name} is listed twice in {value!r}")
        result.append(sig)
    if not result:
        raise ConfigError(
            f"no signal named in {value!r}; the default is {DEFAULT_SIGNALS_TO_HANDLE}"
        )
    return tuple(result)


@contextlib.asynccontextmanager
async def open_signal_forwarder(
    signals: Iterable[int],
    on_signal: Callable[[signal.Signals], Awaitable[None] | None],
) -> AsyncIterator[None]:
    """Call ``on_signal(sig)`` for each of ``signals`` received while the block runs.

    For the CLI path only (it installs process-wide handlers, main thread only):
    embedded use should install none and cancel instead. Handlers are restored
    on exit, also on cancellation. ``on_signal`` may be sync or async; it runs
    in a task of this block, one signal at a time; an exception from it
    cancels the block and propagates out of it (in an ExceptionGroup, as
    anyio task groups do). On asyncio the handlers need the main thread.
    """
    sigs = tuple(signal.Signals(s) for s in signals)
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(*sigs) as receiver:

            async def forward() -> None:
                async for sig in receiver:
                    result = on_signal(signal.Signals(sig))
                    if inspect.isawaitable(result):
                        await result

            tg.start_soon(forward)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
