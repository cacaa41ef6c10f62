"""Shared fixtures: store servers and clients; every anyio backend for tests marked anyio."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

import anyio
import pytest
from pytest_asyncio.plugin import PytestAsyncioFunction

import aelastic
from aelastic.store import StoreServer, TCPStoreClient

T = TypeVar("T")

READY_PREFIX = "aelastic store listening on "


@contextlib.asynccontextmanager
async def _hosted(resource: AbstractAsyncContextManager[T]) -> AsyncIterator[T]:
    """Enter ``resource`` in a task of its own and exit it there, whatever task leaves this.

    pytest-asyncio runs an async fixture's setup and teardown in two different
    tasks, but a resource that owns a task group (``StoreServer``) must be entered
    and exited by one task: this runs it in a host task for the fixture's life.
    """
    entered: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    leave = asyncio.Event()

    async def host() -> None:
        try:
            async with resource as value:
                entered.set_result(value)
                await leave.wait()
        except BaseException as exc:
            if not entered.done():
                entered.set_exception(exc)
            raise

    task = asyncio.get_running_loop().create_task(host())
    try:
        yield await entered
    finally:
        leave.set()
        await task


@pytest.fixture
async def store_server() -> AsyncIterator[StoreServer]:
    """An in-process :class:`StoreServer` on 127.0.0.1, free port."""
    async with _hosted(StoreServer("127.0.0.1", 0)) as server:
        yield server


@pytest.fixture
def hosted() -> Callable[[AbstractAsyncContextManager[T]], AbstractAsyncContextManager[T]]:
    """:func:`_hosted`, for async fixtures that enter a ``StoreServer`` themselves."""
    return _hosted


@pytest.fixture
async def store_client(store_server: StoreServer) -> AsyncIterator[TCPStoreClient]:
    """A :class:`TCPStoreClient` connected to :func:`store_server` (30 s timeout)."""
    async with TCPStoreClient(store_server.host, store_server.port, timeout=30.0) as client:
        yield client


@pytest.fixture
async def store_server_process() -> AsyncIterator[tuple[str, int]]:
    """``python -m aelastic store --port 0`` in a subprocess; yields ``(host, port)``.

    Use it when torch clients run in the test process (a torch client holds the
    GIL while blocked on its socket, so an in-process server could deadlock).
    """
    async with await anyio.open_process(
        [sys.executable, "-m", "aelastic", "store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=None,
    ) as proc:
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive(1)
                line += chunk
        text = line.decode().strip()
        assert text.startswith(READY_PREFIX), f"unexpected store output: {text!r}"
        host, _, port = text[len(READY_PREFIX) :].rpartition(":")
        try:
            yield host, int(port)
        finally:
            with anyio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.terminate()
                    with anyio.move_on_after(10):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()


def pytest_configure(config: pytest.Config) -> None:
    """Write the bytecode of aelastic and of the tests once, before any test starts.

    This project's machines set ``PYTHONDONTWRITEBYTECODE=1``, so no process writes a
    ``__pycache__``, and every agent, CLI and worker process of the suite (hundreds) compiled
    each aelastic module it imported again: 0.43 CPU-s for one ``aelastic run`` against 0.22
    with the bytecode cached, on a suite bound by its CPU (issue 39). Python reads a cache
    whatever that variable says, so this changes nothing the tests' processes see: their
    environment keeps the variable. pytest's own cache of the rewritten test modules is
    written too (``sys.dont_write_bytecode`` in this process). Only the controller of an
    xdist run compiles (its workers start after this hook); an up-to-date file costs a
    ``stat``; a file that does not compile is left to its test to report.
    """
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):
        return
    for tree in (Path(aelastic.__file__).parent, Path(__file__).parent):
        compileall.compile_dir(tree, quiet=2)


#: anyio's pytest plugin runs tests marked ``@pytest.mark.anyio`` once per backend.
BACKENDS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param("trio", id="trio"),
]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """asyncio, asyncio with uvloop and trio, for tests marked ``@pytest.mark.anyio``."""
    backend = request.param
    if backend != "asyncio":
        pytest.importorskip("uvloop" if isinstance(backend, tuple) else "trio")
    return backend


@pytest.hookimpl(wrapper=True)  # groups in place before xdist reads them, checked after
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    """Give tests marked ``anyio`` back to anyio's plugin; group tests for xdist.

    pytest-asyncio's auto mode (the project's default) claims every coroutine test,
    also those anyio's plugin should run on each backend; such an item becomes a plain
    :class:`pytest.Function` again, which anyio's ``pytest_pyfunc_call`` then runs.
    Then, on an xdist worker only, :func:`_xdist_groups` and, after xdist's own hook,
    :func:`_xdist_group_ids`.
    """
    for i, item in enumerate(items):
        if isinstance(item, PytestAsyncioFunction) and item.get_closest_marker("anyio") is not None:
            items[i] = pytest.Function.from_parent(
                item.parent,
                name=item.name,
                callspec=getattr(item, "callspec", None),
                callobj=item.obj,
                fixtureinfo=item._fixtureinfo,
                keywords=item.keywords,
                originalname=item.originalname,
            )
    worker = hasattr(config, "workerinput")  # an xdist worker; nothing to do otherwise
    if worker:
        _xdist_groups(items)
        _longest_groups_first(items)
    yield
    if worker and config.getvalue("loadgroup"):
        _xdist_group_ids(items)


#: the group of every test module that uses the session's real Slurm cluster
SLURM_GROUP = "slurm"


def _xdist_groups(items: list[pytest.Item]) -> None:
    """Mark each test for ``--dist loadgroup``: one group per module, one for Slurm.

    A module's tests then run on one worker, so its module-scoped fixtures (an etcd
    server, a built job) are built once, as with ``--dist loadfile``. Every module that
    uses the ``slurm`` fixture goes to one group: that fixture is session-scoped, so
    the cluster (munged, slurmctld, three slurmd) starts once, on one worker, and the
    other workers never start one. A test that names its own ``xdist_group`` keeps it.
    """
    slurm_modules = {
        item.nodeid.split("::")[0] for item in items if "slurm" in getattr(item, "fixturenames", ())
    }
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::")[0]
        group = SLURM_GROUP if module in slurm_modules else module
        item.add_marker(pytest.mark.xdist_group(group))


#: The groups that take longest, longest first (wall seconds on two xdist workers, issue 39):
#: they start first, so that the run does not end with one worker still in a long group while
#: the other has nothing left to do. A stale or missing entry costs time, never a result.
LONGEST_FIRST = (
    "tests/launcher/test_stragglers.py",  # 240 s
    "tests/chaos/test_chaos.py",  # 200 s
    "tests/replicas/test_replica_groups.py",  # 115 s
    SLURM_GROUP,  # 100 s
    "tests/campaign/test_campaign.py",  # 90 s
    "tests/checkpoint/test_checkpoint_ddp.py",  # 55 s
    "tests/launcher/test_preemption.py",  # 50 s
    "tests/agent/test_preload.py",  # 47 s
    "tests/checkpoint/test_checkpoint_peer.py",  # 44 s
    "tests/agent/test_hang.py",  # 43 s
    "tests/checkpoint/test_checkpoint_dcp.py",  # 40 s
)


def _longest_groups_first(items: list[pytest.Item]) -> None:
    """Order the groups for xdist: :data:`LONGEST_FIRST`, then by their number of tests.

    The second part is xdist's own order, which ``--no-loadscope-reorder`` (the
    project's ``addopts``) turns off so that this one is kept. Each group's tests keep
    their order.
    """

    def group(item: pytest.Item) -> str:
        marker = item.get_closest_marker("xdist_group")
        return str(marker.args[0]) if marker is not None and marker.args else ""

    sizes: dict[str, int] = {}
    for item in items:
        sizes[group(item)] = sizes.get(group(item), 0) + 1
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (first.get(group(item), len(first)), -sizes[group(item)]))


def _xdist_group_ids(items: list[pytest.Item]) -> None:
    """Give each item the ``<nodeid>@<group>`` id that ``--dist loadgroup`` schedules by.

    xdist (3.8) appends the group by assigning ``item._nodeid``, which pytest 9.2 no
    longer reads (a node's id is ``item._id`` now): its suffix is lost and every test
    becomes a group of its own, spread over the workers. Where xdist's suffix did not
    land, this sets it where this pytest keeps the id; a pytest where xdist's works is
    left alone.
    """
    from _pytest.nodeid import NodeId

    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None or "@" in item.nodeid:
            continue
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")  # type: ignore[attr-defined]


class _SwallowedErrors(logging.Handler):
    """Collects what an event loop logged as an error no task got to see."""

    MARKERS = ("Exception in callback", "Task exception was never retrieved")
    #: grpc.aio (the etcd backend's client) keeps one process-wide poller bound to the loop
    #: it first ran on; with a loop per test, its callbacks land on loops already closed.
    #: That is grpc's noise, not an error of the test's own code.
    IGNORED = ("PollerCompletionQueue._handle_events",)

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(self.MARKERS) and not any(i in message for i in self.IGNORED):
            self.messages.append(self.format(record))


@pytest.fixture(autouse=True)
def _no_swallowed_loop_errors() -> Iterator[None]:
    """Fail a test whose event loop swallowed an exception in a callback.

    asyncio logs such an exception and goes on, so the test would pass: even
    pytest-timeout's own failure, raised inside a callback that spins forever, ends
    up there (a hang that passed after 120 s once hid that way).
    """
    handler = _SwallowedErrors()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.messages:
        pytest.fail("the event loop swallowed an error:\n" + "\n".join(handler.messages))


@pytest.fixture(scope="session", autouse=True)
def _session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Point ``TMPDIR`` and :mod:`tempfile` at a directory of pytest's for the session.

    What the code under test puts in the temp dir on purpose (the workers' default log
    directories, ``aelastic_*``, kept for the user as torchrun keeps its own) lands in
    pytest's base temp dir, which pytest prunes (it keeps the last few sessions'), not
    in ``/tmp``; agents and workers started as subprocesses inherit ``TMPDIR``. The
    path stays short (``/tmp/pytest-of-<user>/pytest-<n>/tmp0``): AF_UNIX socket paths
    made under it (munged's, multiprocessing's) fit in their 107 bytes.
    """
    path = str(tmp_path_factory.mktemp("tmp"))
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    try:
        yield path
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
