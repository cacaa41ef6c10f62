"""``python -m aelastic status`` and ``python -m aelastic dashboard``: read a run's view.

Both read the statuses the agents publish in the rendezvous store (c10d: the TCPStore
at ``--rdzv-endpoint``, never hosted here; etcd: ``--rdzv-backend etcd``). A store
that cannot be reached, or a run with no status there, is one line on stderr and
exit code 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio

from ..rendezvous import RendezvousError
from ..store import Store, StoreError
from ._exceptions import JobViewError
from ._view import read_view

__all__ = ("dashboard_main", "status_main")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description=description)
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", required=True, metavar="HOST:PORT")
    p.add_argument("--rdzv-id", "--rdzv_id", required=True, metavar="ID", help="the run id")
    p.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        default="c10d",
        choices=("c10d", "tcp", "etcd", "etcd-v2"),
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="connect and per-request timeout (default 10)",
    )
    return p


class _Unreachable(Exception):
    """The store cannot be reached (exit 2)."""


@asynccontextmanager
async def open_status_store(args: argparse.Namespace) -> AsyncIterator[Store]:
    """The run's status store at the flags' endpoint, read-only use (never hosts one)."""
    from ..rendezvous._params import DEFAULT_C10D_PORT, parse_endpoint
    from ..store import PrefixStore, TCPStoreClient
    from ._keys import STATUS_PREFIX, status_store

    if args.rdzv_backend in ("etcd", "etcd-v2"):
        from ..rendezvous import RendezvousParameters, get_rendezvous_handler

        params = RendezvousParameters(
            args.rdzv_backend,
            args.rdzv_endpoint,
            args.rdzv_id,
            1,
            1,
            read_timeout=str(args.timeout),
        )
        handler = get_rendezvous_handler(params)
        async with handler:
            found = status_store(handler)
            assert found is not None
            yield found[0]
        return
    host, port = parse_endpoint(args.rdzv_endpoint, DEFAULT_C10D_PORT)
    if not getattr(args, "watch", False):
        await _refused_at_once(host, port, args.timeout)
    client = TCPStoreClient(host, port, timeout=args.timeout, connect_timeout=args.timeout)
    async with AsyncExitStack() as stack:
        try:  # only connecting is "unreachable", not an error of the block
            await stack.enter_async_context(client)
        except (StoreError, OSError) as exc:
            raise _Unreachable(
                f"cannot reach the rendezvous store at {host}:{port}: {exc}"
            ) from None
        yield PrefixStore(f"{STATUS_PREFIX}/{args.rdzv_id}", client)


async def _refused_at_once(host: str, port: int, within: float) -> None:
    """Raise ``_Unreachable`` at once when nothing listens at ``host:port``.

    A c10d store lives in the agent that hosts it: refused means the job has ended (or
    not started), and retrying for ``--timeout`` would only delay saying so. One
    connection attempt, closed at once; any other outcome is left to the client.
    """
    try:
        with anyio.move_on_after(within):
            stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
    except OSError as exc:
        if _refused(exc):
            raise _Unreachable(
                f"cannot reach the rendezvous store at {host}:{port}: nothing listens there "
                "(connection refused): the job has ended "
                "(its store went with the node that hosted it) or has not started; --watch "
                "waits for it"
            ) from None
        # unreachable in another way: the client's retries and message decide


def _refused(exc: BaseException | None) -> bool:
    """Whether every connection attempt behind ``exc`` was refused (anyio chains them)."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    group = getattr(exc, "exceptions", None)  # an exception group (Python 3.10: a backport)
    if isinstance(group, tuple) and group:
        return all(_refused(e) for e in group)
    return exc is not None and exc.__cause__ is not None and _refused(exc.__cause__)


def _fail(prog: str, args: argparse.Namespace, exc: BaseException) -> int:
    where = f"{args.rdzv_backend} {args.rdzv_endpoint}"
    print(f"{prog}: {where}: {exc}", file=sys.stderr)
    return 2


_ERRORS = (_Unreachable, JobViewError, StoreError, RendezvousError, OSError)


def _run(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    command: Callable[[argparse.Namespace], Awaitable[None]],
) -> int:
    """Parse ``argv``, run ``command``; 0, or 2 (one line on stderr) for any error."""
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        anyio.run(command, args)
    except TimeoutError:
        return _fail(parser.prog, args, TimeoutError(f"no answer within {args.timeout} s"))
    except _ERRORS as exc:
        return _fail(parser.prog, args, exc)
    except (BrokenPipeError, KeyboardInterrupt):  # output closed, or ^C before the handler
        return 0
    return 0


# -- status ---------------------------------------------------------------------------

_PROG = "python -m aelastic status"


async def _status(args: argparse.Namespace) -> None:
    from ._table import table

    async with open_status_store(args) as store:
        while True:
            try:
                with anyio.fail_after(args.timeout):
                    view = await read_view(store, args.rdzv_id)
            except (JobViewError, StoreError, TimeoutError) as exc:
                if not args.watch:
                    raise
                # --watch outlives a job not started yet and a store being re-hosted
                print(f"{_PROG}: {exc} (retrying)", file=sys.stderr, flush=True)
                await anyio.sleep(args.interval)
                continue
            text = json.dumps(view, indent=None if args.watch else 1) if args.json else table(view)
            if args.watch and not args.json:
                sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: refresh in place
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            if not args.watch:
                return
            await anyio.sleep(args.interval)


def status_parser() -> argparse.ArgumentParser:
    """``aelastic status``'s flags (the docs' examples are checked against it)."""
    p = _parser(_PROG, "Show every node of a run: state, round, ranks, step, steps/s, restarts.")
    p.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="refresh until interrupted (waits for a run that has not published yet)",
    )
    p.add_argument("--interval", type=_positive, default=2.0, help="--watch refresh seconds")
    p.add_argument("--json", action="store_true", help="print the view as JSON")
    return p


def status_main(argv: Sequence[str]) -> int:
    """``aelastic status``: 0, or 2 for bad flags, an unreachable store or unknown run."""
    return _run(status_parser(), argv, _status)


# -- dashboard ------------------------------------------------------------------------


async def _dashboard(args: argparse.Namespace) -> None:
    from ..health._server import serve_routes
    from ._http import view_route

    async with open_status_store(args) as store:
        with anyio.fail_after(args.timeout):
            await read_view(store, args.rdzv_id)  # a wrong run id fails now, not in the page

        async def read() -> dict[str, Any]:
            return await read_view(store, args.rdzv_id)

        async with anyio.create_task_group() as tg:
            host, port = await tg.start(
                serve_routes,
                lambda method, path: view_route(read, path),
                args.health_host,
                args.port,
            )
            shown = f"[{host}]" if ":" in host else host
            print(f"aelastic dashboard: serving http://{shown}:{port}/", flush=True)
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return


def dashboard_parser() -> argparse.ArgumentParser:
    """``aelastic dashboard``'s flags (the docs' examples are checked against it)."""
    prog = "python -m aelastic dashboard"
    p = _parser(prog, "Serve a run's live page (every node, steps/s over time) over HTTP.")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (0: any free port)")
    p.add_argument(
        "--health-host",
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    return p


def dashboard_main(argv: Sequence[str]) -> int:
    """``aelastic dashboard``: serve the live page until SIGINT/SIGTERM (exit 0), 2 on errors."""
    return _run(dashboard_parser(), argv, _dashboard)
