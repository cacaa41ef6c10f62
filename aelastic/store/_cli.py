"""``python -m aelastic store``: a standalone TCPStore-compatible server."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from ._exceptions import StoreConfigError, StoreError
from ._limits import FRAME_TIMEOUT, MAX_BUFFERED_BYTES, MAX_CONNECTIONS
from ._protocol import MAX_KEY_COUNT, MAX_KEY_SIZE, MAX_VALUE_SIZE
from ._server import StoreServer

__all__ = ("main",)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"aelastic store: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0-65535")
    return value


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m aelastic store",
        description="Serve a TCPStore-compatible key-value store (torch clients can connect).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=29400, help="port (0 picks a free one)")
    p.add_argument(
        "--allow-non-loopback",
        action="store_true",
        help="allow binding a non-loopback address (the store has no authentication)",
    )
    limit = "; a request above it closes that connection"
    p.add_argument(
        "--max-key-size", type=_positive, default=MAX_KEY_SIZE, metavar="BYTES",
        help=f"longest key (default {MAX_KEY_SIZE}){limit}",
    )  # fmt: skip
    p.add_argument(
        "--max-value-size", type=_positive, default=MAX_VALUE_SIZE, metavar="BYTES",
        help=f"largest value (default {MAX_VALUE_SIZE}){limit}",
    )  # fmt: skip
    p.add_argument(
        "--max-key-count", type=_positive, default=MAX_KEY_COUNT, metavar="N",
        help=f"most keys in one request (default {MAX_KEY_COUNT}){limit}",
    )  # fmt: skip
    p.add_argument(
        "--max-frame-size", type=_positive, default=None, metavar="BYTES",
        help=f"largest request, all its keys and values (default: no bound beyond the key,"
        f" value and key-count limits, as torch's server){limit}",
    )  # fmt: skip
    p.add_argument(
        "--max-connection-buffer", type=_positive, default=None, metavar="BYTES",
        help=f"partial request held for one client (default: no bound; memory is bounded by"
        f" --max-buffered-bytes){limit}",
    )  # fmt: skip
    p.add_argument(
        "--max-buffered-bytes", type=_positive, default=MAX_BUFFERED_BYTES, metavar="BYTES",
        help=f"partial requests held for all clients (default {MAX_BUFFERED_BYTES}); "
        "beyond, only the oldest is read",
    )  # fmt: skip
    p.add_argument(
        "--frame-timeout", type=_seconds, default=FRAME_TIMEOUT, metavar="SECONDS",
        help=f"time to finish sending a request (default {FRAME_TIMEOUT:g}){limit}",
    )  # fmt: skip
    p.add_argument(
        "--max-connections", type=_positive, default=MAX_CONNECTIONS, metavar="N",
        help=f"most simultaneous clients (default {MAX_CONNECTIONS}); more are refused",
    )  # fmt: skip
    p.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop", "trio"),
        default="auto",
        help="event loop: uvloop if installed (auto, the default), or force one",
    )
    p.add_argument(
        "--uvloop", action="store_const", const="uvloop", dest="loop", help="--loop uvloop"
    )
    p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    return p


async def _serve(args: argparse.Namespace) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with StoreServer(
            args.host,
            args.port,
            max_key_size=args.max_key_size,
            max_value_size=args.max_value_size,
            max_key_count=args.max_key_count,
            max_frame_size=args.max_frame_size,
            max_connection_buffer=args.max_connection_buffer,
            max_buffered_bytes=args.max_buffered_bytes,
            frame_timeout=args.frame_timeout,
            max_connections=args.max_connections,
            allow_non_loopback=args.allow_non_loopback,
        ) as server:
            print(f"aelastic store listening on {server.address}", flush=True)
            async for _ in signals:
                return


def main(argv: Sequence[str]) -> int:
    """Run the store until SIGTERM/SIGINT; return the exit code (2 on bad flags)."""
    try:
        args = _build_parser().parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        print(
            f"aelastic store: unknown --log-level {args.log_level!r}; use DEBUG, INFO, "
            "WARNING or ERROR",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    backend, options = "asyncio", {}
    if args.loop == "trio":
        backend = "trio"
    elif args.loop != "asyncio":
        if importlib.util.find_spec("uvloop") is not None:
            options = {"use_uvloop": True}
        elif args.loop == "uvloop":
            print("aelastic store: --loop uvloop but uvloop is not installed", file=sys.stderr)
            return 2
    backend_options: dict[str, Any] = options
    try:
        anyio.run(_serve, args, backend=backend, backend_options=backend_options)
    except StoreConfigError as exc:
        print(f"aelastic store: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"aelastic store: {exc}", file=sys.stderr)
        return 1
    return 0
