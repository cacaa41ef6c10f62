"""``python -m aelastic events``: print a run's events from a store, one JSON object a line.

Events are popped from the store queue ``aelastic/events/<run id>`` (see
:func:`aelastic.events._store.configure_store`): **reading consumes them**, so run one consumer
per run. Without ``--follow`` the command exits once the queue is empty; with it, it
waits for more until SIGINT or SIGTERM (exit code 0).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import anyio

from ..store import StoreError, StoreTimeoutError
from ..store._exceptions import QueueEmptyError
from ._store import events_key

__all__ = ("main",)

_PROG = "python -m aelastic events"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"aelastic events: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:29400), got {text!r}")
    return host, int(port)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=_PROG,
        description="Print a run's events (JSON lines) from an aelastic/torch store. "
        "Reading consumes the events.",
    )
    p.add_argument("--store", required=True, type=_endpoint, metavar="HOST:PORT")
    p.add_argument("--run-id", required=True, help="the run whose events to print")
    p.add_argument(
        "--follow", "-f", action="store_true", help="keep waiting for events until SIGINT/SIGTERM"
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="connect and per-request timeout (default 30)",
    )
    return p


def _emit(raw: bytes) -> None:
    sys.stdout.write(raw.decode("utf-8", errors="replace") + "\n")
    sys.stdout.flush()


async def _drain(args: argparse.Namespace) -> None:
    from ..store import TCPStoreClient

    host, port = args.store
    key = events_key(args.run_id)
    async with TCPStoreClient(
        host, port, timeout=args.timeout, connect_timeout=args.timeout
    ) as client:
        while True:
            try:
                _emit(await client.queue_pop(key, block=False))
            except QueueEmptyError:
                break
        if not args.follow:
            return
        while True:
            try:
                _emit(await client.queue_pop(key, block=True, timeout=args.timeout))
            except StoreTimeoutError:
                continue


async def _run(args: argparse.Namespace) -> None:
    error: StoreError | None = None
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_signal)
        try:
            await _drain(args)
        except StoreError as exc:  # raised below, not as an exception group
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error


def main(argv: Sequence[str]) -> int:
    """Print the events; return 0, 1 on a store error, 2 on bad flags."""
    try:
        args = _build_parser().parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        anyio.run(_run, args)
    except StoreError as exc:
        print(f"aelastic events: store {args.store[0]}:{args.store[1]}: {exc}", file=sys.stderr)
        return 1
    except (BrokenPipeError, KeyboardInterrupt):  # output closed, or ^C before the handler
        return 0
    return 0
