"""The agent side: the node's checkpoint memory, the step workers resume from, disk copies.

:func:`open_checkpoints` creates this run's directory in shared memory (``/dev/shm``;
the agent owns it, so what a worker committed there outlives the worker), runs the
periodic disk copy when ``--checkpoint-dir`` is set, and on exit (success, failure,
cancellation) copies the newest complete step to disk once more and frees the memory.
Everything that touches a file runs in a worker thread, one at a time: the event
loop never waits on a disk.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from .._tasks import background_tasks
from ..store import Store, StoreError
from . import _layout as L
from ._disk import write_step
from ._exceptions import CheckpointError
from ._owner import claim, release_if_empty, sweep_abandoned
from ._peer_copies import PeerCopies, PeerRound, announce_no_peer_copies, open_peer_copies
from ._resume import Holdings, choose, fetch_plan, holdings, lost, to_delete
from ._settings import CheckpointSettings

__all__ = ("Checkpoints", "open_checkpoints")

log = logging.getLogger("aelastic.checkpoint")

#: How long the agents of a round wait for each other's checkpoint steps.
_AGREE_TIMEOUT = 60.0
_KEY = "aelastic/checkpoint"

Emit = Callable[[str, Mapping[str, Any]], None]


#: Where the agent creates its memory directory (default ``/dev/shm``): one root per
#: agent makes several agents on one machine behave like separate machines.
MEMORY_ROOT_ENV = "AELASTIC_CHECKPOINT_MEMORY_ROOT"


def memory_root() -> str:
    """``$AELASTIC_CHECKPOINT_MEMORY_ROOT``, else ``/dev/shm`` when usable (memory), else
    the temp directory."""
    chosen = os.environ.get(MEMORY_ROOT_ENV)
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        return chosen
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class Checkpoints:
    """One node's checkpoints for one run: see :func:`open_checkpoints`."""

    def __init__(
        self,
        memory_dir: str,
        persist_dir: str | None,
        emit: Emit,
        peer_copies: PeerCopies | None = None,
    ) -> None:
        self.memory_dir = memory_dir
        #: the peer copies (``--checkpoint-peer-copies``; None: off)
        self.peer_copies = peer_copies
        self.persist_dir = persist_dir
        self._emit = emit
        #: the global ranks of the current round's workers on this node
        self.local_ranks: tuple[int, ...] = ()
        #: the step the current workers resume from (None: none)
        self.resumed_step: int | None = None
        #: the newest step written to ``persist_dir`` by this agent
        self.persisted_step: int | None = None
        self._limiter = anyio.CapacityLimiter(1)

    def env(self) -> dict[str, str]:
        """What every worker needs in its environment to save and load."""
        env = {L.DIR_ENV: self.memory_dir}
        if self.persist_dir is not None:
            env[L.PERSIST_DIR_ENV] = self.persist_dir
        return env

    def held_bytes(self) -> int:
        """Bytes of committed steps in memory: a listing and a stat per rank file of the
        (at most two) steps kept in memory, so cheap enough for ``/status``."""
        return sum(
            size
            for step in L.scan(self.memory_dir).values()
            for files in step.ranks.values()
            for size in files.values()
        )

    def status(self) -> dict[str, Any]:
        return {
            "memory_dir": self.memory_dir,
            "bytes_held": self.held_bytes(),
            "resumed_step": self.resumed_step,
            "persist_dir": self.persist_dir,
            "persisted_step": self.persisted_step,
            "peer_copies": None if self.peer_copies is None else self.peer_copies.status(),
        }

    # -- the step to resume from ----------------------------------------------------------

    def _holdings(self, ranks: Sequence[int], serves: bool) -> Holdings:
        """What this node holds for the round to agree on (blocking: scans both dirs)."""
        disk: dict[int, L.Step] = {}
        disk_metadata: list[int] = []
        if self.persist_dir is not None:
            disk = L.scan(self.persist_dir)
            disk_metadata = _with_metadata(self.persist_dir, disk)
        memory = L.scan(self.memory_dir)
        metadata = _with_metadata(self.memory_dir, memory)
        return holdings(ranks, memory, disk, metadata, disk_metadata, serves)

    def _keep_only(self, chosen: tuple[int, int] | None) -> None:
        """Delete interrupted saves and the memory steps :func:`~._resume.to_delete` names
        for a round that chose ``chosen`` (blocking). Run while no worker runs."""
        for name in os.listdir(self.memory_dir):
            path = os.path.join(self.memory_dir, name)
            for tmp in os.listdir(path) if os.path.isdir(path) else ():
                if tmp.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(path, tmp))
        steps = L.scan(self.memory_dir)
        for number in to_delete(steps, chosen):
            L.remove_ranks(self.memory_dir, steps[number])

    async def resume_env(
        self,
        ranks: Sequence[int],
        store: Store,
        group_rank: int,
        group_world_size: int,
        membership_changed: Callable[[], Awaitable[None]] | None = None,
        address: tuple[str, str] | None = None,
    ) -> dict[str, str]:
        """Decide the step this round's workers resume from; their environment for it.

        Each agent publishes what it holds (memory and ``--checkpoint-dir``) in the
        round's ``store`` and reads the others' (one ``set`` and one ``multi_get``); all
        then apply the same rule (``_resume``: the newest step every node can read what
        its ranks need of), and each fetches the files it lacks from the peers that hold
        them (``--checkpoint-peer-copies``: a node that joins or replaces a lost one). The
        wait for the peers ends early when ``membership_changed()`` returns (no step then,
        and nothing is deleted: the round is over anyway, the next one decides).

        With peer copies and several nodes, ``address`` is ``(bind, advertised)`` of
        this node's peer-copy listener.

        Only call between rounds (no worker running). A peer that cannot send a file is
        logged (the worker that needs it then fails to load, and the next round decides
        again). Cancellation: stops waiting.
        """
        self.local_ranks = tuple(ranks)
        peer_round, peers = None, self.peer_copies
        alone = group_world_size <= 1
        serves = False
        if not alone and peers is not None and address is not None:
            peer_round = PeerRound(store, group_rank, group_world_size, self.local_ranks, *address)
            try:  # ends early when the round does (a peer died before announcing itself)
                serves = await _unless_membership_changes(
                    functools.partial(peers.join, peer_round), membership_changed
                )
            except StoreError as exc:
                log.warning("cannot reach the other agents' checkpoint peer copies: %s", exc)
        elif not alone:
            with contextlib.suppress(StoreError):  # the agreement below reports it
                await announce_no_peer_copies(store, group_rank)
        async with self._limiter:
            mine = await anyio.to_thread.run_sync(self._holdings, list(ranks), serves)
        nodes: list[Holdings] | None = [mine]
        if not alone:
            try:
                nodes = await self._gather(
                    mine, store, group_rank, group_world_size, membership_changed
                )
            except StoreError as exc:  # the round's store is gone: so is the round
                log.warning("cannot agree on a checkpoint step with the other agents: %s", exc)
                nodes = None
        chosen = None if nodes is None else choose(nodes)
        if nodes is not None:  # None: cut short, the next round decides
            me = 0 if alone else group_rank
            if chosen is not None and peer_round is not None:
                await self._fetch(nodes, me, chosen, peer_round)
            _warn_lost(nodes, me, chosen)
            async with self._limiter:
                await anyio.to_thread.run_sync(self._keep_only, chosen)
        step = None if chosen is None else chosen[0]
        self.resumed_step = step
        if peer_round is not None and peers is not None:
            peers.started(peer_round)
        held = self.held_bytes()
        if chosen is not None or held:  # a job that never saves hears nothing of checkpoints
            self._emit(
                "aelastic.checkpoint.resume",
                {
                    "step": step,
                    "world_size": None if chosen is None else chosen[1],
                    "bytes_held": held,
                },
            )
        if chosen is None:
            return {L.STEP_ENV: ""}
        return {L.STEP_ENV: str(chosen[0]), L.WORLD_ENV: str(chosen[1])}

    async def _gather(
        self,
        mine: Holdings,
        store: Store,
        group_rank: int,
        group_world_size: int,
        membership_changed: Callable[[], Awaitable[None]] | None,
    ) -> list[Holdings] | None:
        """Every node's :class:`Holdings`, by group rank; None when the wait for them was
        cut short (a membership change, or :data:`_AGREE_TIMEOUT`). Raises StoreError."""
        await store.set(f"{_KEY}/{group_rank}", json.dumps(mine.to_json()))
        keys = [f"{_KEY}/{r}" for r in range(group_world_size)]
        nodes: list[Holdings] = []

        async def gather() -> None:
            for r, raw in enumerate(await store.multi_get(keys)):
                try:
                    nodes.append(Holdings.from_json(json.loads(raw)))
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.warning("node %d published no readable checkpoint holdings: %s", r, exc)
                    nodes.append(Holdings((), {}, {}))

        # A peer that died before publishing must not hold the round up: the round
        # ends with the membership change, or the wait with the timeout.
        with anyio.move_on_after(_AGREE_TIMEOUT) as scope:
            finished = await _unless_membership_changes(gather, membership_changed)
        if scope.cancelled_caught:
            log.warning(
                "the other agents did not publish their checkpoint steps within %.0f s; "
                "the workers start without a checkpoint",
                _AGREE_TIMEOUT,
            )
            return None
        return nodes if finished else None

    async def _fetch(
        self, nodes: Sequence[Holdings], me: int, chosen: tuple[int, int], pr: PeerRound
    ) -> None:
        """Fetch what this node lacks of the ``chosen`` step from its peers, at the same
        time. A peer that fails is logged (the worker needing its files fails to load)."""
        plan = fetch_plan(nodes, me, *chosen)
        peers = self.peer_copies
        if not plan or peers is None:
            return
        step, world = chosen
        async with anyio.create_task_group() as tg:
            for peer, ranks in plan.items():
                tg.start_soon(peers.fetch, pr, peer, step, world, sorted(ranks))

    # -- disk -----------------------------------------------------------------------------

    async def persist(self, *, last: bool = False) -> None:
        """Copy the newest step complete for this node's ranks to ``persist_dir`` (if newer
        than the last copied), in a worker thread. Errors are logged and reported as the
        ``aelastic.checkpoint.persist_failed`` event, never raised: training goes on.
        Cancellation: waits for a copy in progress (bounded by its size) to finish.

        ``last`` (the copy on exit) of a node with peers writes the step before the
        newest too, when memory still holds it whole: nodes stopped at once (a Slurm
        requeue or preemption SIGTERMs every process of the job) can hold newest steps
        one apart, and a shared ``persist_dir`` is whole only at a step every node wrote;
        ranks kept in step by their collectives all hold one of their two newest steps."""
        if self.persist_dir is None or not self.local_ranks:
            return
        disk, ranks = self.persist_dir, list(self.local_ranks)
        async with self._limiter:
            complete = await anyio.to_thread.run_sync(
                lambda: L.complete_steps(L.scan(self.memory_dir), ranks)
            )
            done = self.persisted_step
            steps = sorted(s for s in complete if done is None or s > done)
            others = bool(steps) and complete[steps[-1]] > len(ranks)  # other nodes' ranks
            for step in steps[-2 if last and others else -1 :]:
                await self._write(disk, step, complete[step], ranks)

    async def _write(self, disk: str, step: int, world: int, ranks: list[int]) -> None:
        """One step's copy to ``disk`` (see :meth:`persist`); failures are events."""
        started = time.monotonic()
        try:
            size = await anyio.to_thread.run_sync(
                write_step, self.memory_dir, disk, step, world, ranks
            )
        except CheckpointError as exc:
            log.error("%s", exc)
            self._emit("aelastic.checkpoint.persist_failed", {"step": step, "error": str(exc)})
            return
        if size:
            self.persisted_step = step
            seconds = time.monotonic() - started
            log.info(
                "checkpoint step %d written to %s (%d bytes, %.2f s)", step, disk, size, seconds
            )
            self._emit(
                "aelastic.checkpoint.persisted",
                {"step": step, "bytes": size, "duration_ms": round(seconds * 1000), "dir": disk},
            )

    async def _persist_every(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            await self.persist()


async def _unless_membership_changes(
    work: Callable[[], Awaitable[object]],
    membership_changed: Callable[[], Awaitable[None]] | None,
) -> bool:
    """Run ``work()``; True once it finished, False if ``membership_changed()`` returned
    first (``work`` is then cancelled: the round is over anyway)."""
    finished = False
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            nonlocal finished
            await work()
            finished = True
            tg.cancel_scope.cancel()

        async def watch() -> None:
            if membership_changed is not None:
                await membership_changed()
                tg.cancel_scope.cancel()

        tg.start_soon(run)
        tg.start_soon(watch)
    return finished


def _with_metadata(root: str, steps: Mapping[int, L.Step]) -> list[int]:
    """The steps of ``steps`` whose DCP ``.metadata`` is in ``root`` (blocking)."""
    return [s for s in steps if os.path.exists(os.path.join(L.step_dir(root, s), L.METADATA))]


def _warn_lost(nodes: Sequence[Holdings], me: int, chosen: tuple[int, int] | None) -> None:
    """Say once per round (on the first node) what progress the round gives up and why."""
    newest = lost(nodes, chosen)
    if newest is None or me != 0:
        return
    if chosen is not None:  # the step in flight when the round ended: expected
        log.info("checkpoint steps up to %d were not saved by every rank; dropped", newest)
        return
    log.warning(
        "checkpoint step %d is held by this job's nodes, but not every node can read what "
        "its ranks need of it; the workers start from scratch. A node fetches its "
        "ranks' files from its peers' memory: keep --checkpoint-peer-copies >= 1, or give "
        "the nodes a shared --checkpoint-dir (a node lost while its copies lagged: see "
        "docs/checkpoints.md, 'Resizing')",
        newest,
    )


def _safe(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:64]


def _sweep_and_claim(name: str) -> tuple[list[str], tuple[str, int]]:
    """Free what killed agents left, then claim this run's directory (blocking).

    One thread hop for both: each hop costs the job's start a thread hand-off.
    """
    root = memory_root()
    return sweep_abandoned(root), claim(root, name)


@contextlib.asynccontextmanager
async def open_checkpoints(
    run_id: str,
    settings: CheckpointSettings,
    emit: Emit,
    peer_key: bytes | None = None,
) -> AsyncIterator[Checkpoints]:
    """This run's checkpoint memory on this node; freed (after a last disk copy) on exit.

    First frees what agents killed earlier left in ``/dev/shm`` (see ``_owner``). With
    ``settings.dir`` the newest step is written there every ``settings.persist_interval``
    seconds. ``settings.peer_copies`` > 0: the newest step of this node's ranks is copied
    to that many other nodes in the background (see ``_peer_copies``), until the block is
    left; their connections are authenticated with ``peer_key`` (read from
    ``settings.job_secret_file`` by the agent; None: a key the agents agree on in the
    round's store).

    Cleanup survives cancellation (shielded): the last copy to ``settings.dir`` takes as
    long as the newest step takes to write, then the memory is freed.
    """
    persist_dir, peer_copies = settings.dir, settings.peer_copies
    freed, (memory_dir, lock) = await anyio.to_thread.run_sync(_sweep_and_claim, _safe(run_id))
    if freed:
        log.warning("freed checkpoint memory that killed agents left behind: %s", freed)
    checkpoints = Checkpoints(memory_dir, persist_dir, emit)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if peer_copies > 0:
                checkpoints.peer_copies = await stack.enter_async_context(
                    open_peer_copies(memory_dir, peer_copies, key=peer_key)
                )
            tg = await stack.enter_async_context(background_tasks())
            if persist_dir is not None:
                tg.start_soon(checkpoints._persist_every, settings.persist_interval)
            yield checkpoints
    finally:
        with anyio.CancelScope(shield=True):
            await checkpoints.persist(last=True)
            held = checkpoints.held_bytes()
            if not release_if_empty(memory_dir):
                await anyio.to_thread.run_sync(shutil.rmtree, memory_dir, True)
            os.close(lock)
            if held:
                emit("aelastic.checkpoint.freed", {"bytes": held})
