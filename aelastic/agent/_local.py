"""``LocalElasticAgent``: workers are local subprocesses (aelastic.workers), one group each."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from .._features import feature_modules, file_timer_enabled, import_features
from .._net import is_loopback, node_address, route_source
from ..checkpoint import _read_job_secret
from ..checkpoint._agent import Checkpoints, open_checkpoints
from ..checkpoint._settings import CheckpointSettings
from ..errors import ProcessFailure
from ..metrics import prof
from ..store import StoreServer
from ..workers import open_worker_processes
from ..workers._callable import callable_process_args, read_callable_result
from ..workers._logs import LogDestinations, make_run_log_dir, remove_empty_log_dirs
from ..workers._processes import WorkerProcesses
from ..workers._spec import ProcessExit
from ..workers._warm import WarmPool, open_warm_pool, parse_python_argv, warm_workers_enabled
from ._agent import SimpleElasticAgent
from ._env import substitute_local_rank, worker_env
from ._exceptions import AgentConfigError
from ._flight_recorder import torch_defaults
from ._policy import restart_count
from ._telemetry import hostname
from ._types import RunResult, WorkerGroup, WorkerSpec, WorkerState

# Loaded only by a job with hang detection or torch's file timer (aelastic._features):
# imported at the point of use, where run() has already imported them off the loop.
if TYPE_CHECKING:
    from ._file_timer import FileTimerServer
    from ._hang import ProgressDirectory, RoundProgress

__all__ = ("LocalElasticAgent",)

log = logging.getLogger("aelastic.agent")

_LOOPBACK = "127.0.0.1"


class LocalElasticAgent(SimpleElasticAgent):
    """Runs ``spec.local_world_size`` worker subprocesses on this node.

    Binary entrypoints run as ``[entrypoint, *args]``; callables run in a spawned
    Python interpreter and their return values land in ``RunResult.return_values``.
    Each worker is its own process group and dies with the agent (PR_SET_PDEATHSIG).
    Python script/module entrypoints run in interpreters pre-started when ``run()``
    begins and after each (re)start (a warm pool; ``AELASTIC_WARM_WORKERS=0`` turns it
    off), so a restart does not wait for interpreter start-up.

    Workers' store: for every round the group-rank-0 agent hosts a fresh
    TCPStore-compatible :class:`~aelastic.store.StoreServer` on an ephemeral port and
    hands it to all workers (``MASTER_ADDR``/``MASTER_PORT``,
    ``TORCHELASTIC_USE_AGENT_STORE=True``): no key of an earlier round is ever read
    and there is no free-port race. An explicit ``spec.master_port`` is honoured
    instead (the static backend's endpoint).

    ``worker_env_extra`` is added to every worker's environment (e.g.
    ``TORCHELASTIC_SIGNALS_TO_HANDLE``, a job's own variables); the agent's own
    ``os.environ`` is never modified. ``worker_cwd``: the workers' working directory
    (None: the agent's). ``warm_workers=False`` starts every worker as a fresh
    interpreter, with no idle pre-started ones (see :func:`aelastic.workers._warm.open_warm_pool`;
    ``AELASTIC_WARM_WORKERS=0`` turns them off for every agent).
    ``worker_ignored_signals``: signals every worker starts with ignored (``SIG_IGN``;
    ``aelastic run`` passes SIGUSR1 when it traps it as a preemption notice, which
    Slurm sends the workers too). With ``spec.log_dir``
    None the run's fresh temporary log tree is removed at the end of :meth:`run` as
    far as it holds no file. Arguments ``exit_barrier_timeout``, ``shutdown_timeout``,
    ``log_line_prefix_template`` and ``uninterruptible_state_timeout`` (torch's
    opt-in D-state check, see :class:`SimpleElasticAgent`; worker states come from
    ``/proc/<pid>/stat``) override the spec's values.

    Checkpoints (:mod:`aelastic.checkpoint`): the agent creates a directory in
    ``/dev/shm`` for the run that workers ``save()`` into, decides at each start the
    step they resume from (complete on every node), and frees it when ``run()`` ends.
    ``checkpoints`` (:class:`aelastic.CheckpointSettings`; None: its defaults): with its
    ``dir`` the agent also writes the newest complete step there every
    ``persist_interval`` seconds and before ``run()`` returns or raises. With several
    nodes it copies its ranks' newest step to the next ``peer_copies`` nodes' agents (0:
    none), and a node that replaces a lost one fetches its ranks' step from them before
    its workers start. Their connections prove they hold the job's key:
    ``job_secret_file``'s, else one the agents agree on through the rendezvous store
    (docs/security.md, "Checkpoint peer listener"). The flat ``checkpoint_*`` arguments
    it took before are gone (docs/checkpoints.md, "Names").
    """

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        exit_barrier_timeout: float | None = None,
        shutdown_timeout: float | None = None,
        log_line_prefix_template: str | None = None,
        worker_env_extra: Mapping[str, str] | None = None,
        start_method: str = "spawn",
        uninterruptible_state_timeout: float | None = None,
        worker_cwd: str | None = None,
        warm_workers: bool = True,
        checkpoints: CheckpointSettings | None = None,
        worker_ignored_signals: Collection[int] = (),
    ) -> None:
        super().__init__(
            spec, exit_barrier_timeout, shutdown_timeout, uninterruptible_state_timeout
        )
        if start_method != "spawn":
            raise AgentConfigError(
                f"start_method={start_method!r}: aelastic always spawns a fresh interpreter"
                " for callable entrypoints; use 'spawn'"
            )
        self._log_line_prefix_template = log_line_prefix_template or spec.log_line_prefix_template
        self._worker_env_extra = dict(worker_env_extra or {})
        self._worker_cwd = worker_cwd
        self._warm_workers = warm_workers
        self._worker_ignored_signals = frozenset(int(s) for s in worker_ignored_signals)
        self._procs: WorkerProcesses | None = None
        self._exits: dict[int, ProcessExit] = {}
        self._error_files: dict[int, str | None] = {}
        # Local ranks that had failed on their own when the agent first stopped the
        # round's workers (None: not stopped yet); see _monitor_workers.
        self._failed_before_stop: frozenset[int] | None = None
        self._result_files: dict[int, str] = {}
        self._result_dir: tempfile.TemporaryDirectory[str] | None = None
        self._warm_pool: WarmPool | None = None
        self._log_run_dir: str | None = None  # <log_dir>/<run_id>_<random>, this agent's
        self._progress_dir: ProgressDirectory | None = None
        self._file_timer: FileTimerServer | None = None
        # {local_rank: stacks file} of this round when the file timer is served
        self._timer_stacks: dict[int, str] = {}
        self._log_destinations: LogDestinations | None = None
        self._checkpoint_settings = CheckpointSettings() if checkpoints is None else checkpoints
        self._checkpoints: Checkpoints | None = None

    @property
    def checkpoints(self) -> Checkpoints | None:
        """This run's checkpoints on this node (None outside ``run()``)."""
        return self._checkpoints

    @property
    def log_run_dir(self) -> str | None:
        """This agent's run log directory, ``<log_dir>/<run_id>_<random>`` (None before
        the first start, and with ``log_dir=os.devnull``)."""
        return self._log_run_dir

    @property
    def log_destinations(self) -> LogDestinations | None:
        """Where the current (last) attempt's workers log; None before the first start."""
        return self._log_destinations

    # -- the workers' store ------------------------------------------------------------

    async def _worker_store_endpoint(self) -> tuple[str, int, bool]:
        spec = self._worker_group.spec
        if spec.master_port is not None:
            return await super()._worker_store_endpoint()
        stack = self._round_stack
        assert stack is not None
        bind, advertised = await self._node_address(spec.master_addr or spec.local_addr)
        server = StoreServer(bind, 0, allow_non_loopback=not is_loopback(bind))
        await stack.enter_async_context(server)
        log.debug("hosting the workers' store on %s (advertised %s)", server.address, advertised)
        return advertised, server.port, True

    async def _node_address(self, advertised: str | None) -> tuple[str, str]:
        """(address to bind, address to announce) of a server this node offers the others:
        ``advertised`` if set; loopback for one node or a rendezvous on loopback; else the
        address this node reaches the rendezvous from, announced by host name when that
        name resolves to it (:func:`aelastic._net.node_address`). Names are resolved in a
        thread; an unresolvable one falls back to every interface and the host name."""
        if advertised is not None:
            return advertised, advertised
        if self._worker_group.group_world_size == 1 or self._rendezvous_is_local():
            return _LOOPBACK, _LOOPBACK
        rdzv = self._rdzv_info
        info = None if rdzv is None else rdzv.bootstrap_store_info
        source = None
        if info is not None and info.master_addr:
            source = await _route_source(info.master_addr)
        name = hostname()
        return node_address(source, name, await _resolve(name) if source else [])

    def _rendezvous_is_local(self) -> bool:
        rdzv = self._rdzv_info
        info = None if rdzv is None else rdzv.bootstrap_store_info
        return info is not None and is_loopback(info.master_addr)

    # -- starting and stopping ---------------------------------------------------------

    @prof
    async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec = worker_group.spec
        stack = self._round_stack
        assert stack is not None
        assert worker_group.group_rank is not None and worker_group.group_world_size is not None
        assert worker_group.master_addr is not None and worker_group.master_port is not None
        run_id = spec.rdzv_handler.get_run_id()
        log_dir = None if spec.log_dir is None else os.fspath(spec.log_dir)
        if self._log_run_dir is None:
            self._log_run_dir = make_run_log_dir(log_dir, run_id)
        restarts = restart_count(spec.max_restarts, self._remaining_restarts)
        dests = LogDestinations.for_attempt(
            log_dir,
            run_id,
            restarts,
            spec.local_world_size,
            spec.redirects,
            spec.tee,
            spec.local_ranks_filter,
            self._log_line_prefix_template,
            role=spec.role,
            run_dir=self._log_run_dir,
            global_ranks={w.local_rank: w.global_rank for w in worker_group.workers},
            duplicate_stdout_filters=spec.duplicate_stdout_filters,
            duplicate_stderr_filters=spec.duplicate_stderr_filters,
        )
        self._log_destinations = dests
        base_env = os.environ.copy()
        progress = self._open_round_progress(dests.attempt_dir)
        self._timer_stacks = self._open_timer_stacks(dests.attempt_dir, progress)
        extra = {**self._worker_env_extra, **await self._checkpoint_env(worker_group)}
        self._exits = {}
        self._error_files = {}
        self._failed_before_stop = None
        self._result_files = {}
        specs = []
        for worker in worker_group.workers:
            rank = worker.local_rank
            error_file = dests.error_files.get(rank)
            env = worker_env(
                base_env,
                local_rank=rank,
                global_rank=worker.global_rank,
                role_rank=worker.role_rank,
                world_size=worker.world_size,
                role_world_size=worker.role_world_size,
                role=spec.role,
                local_world_size=spec.local_world_size,
                group_rank=worker_group.group_rank,
                group_world_size=worker_group.group_world_size,
                master_addr=worker_group.master_addr,
                master_port=worker_group.master_port,
                restart_count=restarts,
                max_restarts=spec.max_restarts,
                run_id=run_id,
                use_agent_store=self._use_agent_store,
                error_file=error_file,
                extra={**extra, **self._stacks_env(progress, rank)},
                virtual_local_rank=spec.virtual_local_rank,
            )
            env.update(torch_defaults(env))  # the flight recorder's, when it is asked for
            self._error_files[rank] = error_file
            specs.append(
                dests.process_spec(rank, self._worker_args(spec, rank), env, self._worker_cwd)
            )
        procs = await stack.enter_async_context(
            open_worker_processes(
                specs,
                shutdown_timeout=self._shutdown_timeout,
                warm_pool=self._warm_pool,
                exit_grace=spec.exit_grace,
                ignored_signals=self._worker_ignored_signals,
            )
        )
        self._procs = procs
        if self._file_timer is not None:
            self._file_timer.worker_pids = frozenset(procs.pids.values())
        if progress is not None:
            progress.started(procs.pids)
        # LIFO: runs before the processes' own exit, so a forwarded signal reaches them.
        stack.push_async_callback(self._stop_on_round_exit)
        return dict(procs.pids)

    async def _checkpoint_env(self, worker_group: WorkerGroup) -> dict[str, str]:
        """The checkpoint variables of this round's workers (the step to resume from)."""
        checkpoints = self._checkpoints
        if checkpoints is None:
            return {}
        assert worker_group.group_rank is not None and worker_group.group_world_size is not None
        assert worker_group.store is not None  # set by the rendezvous before any start
        resume = await checkpoints.resume_env(
            [w.global_rank for w in worker_group.workers],
            worker_group.store,
            worker_group.group_rank,
            worker_group.group_world_size,
            worker_group.spec.rdzv_handler.wait_for_membership_change,
            await self._node_address(worker_group.spec.local_addr),
        )
        return {**checkpoints.env(), **resume}

    @asynccontextmanager
    async def _open_checkpoints(self) -> AsyncIterator[None]:
        """This run's checkpoint memory (aelastic.checkpoint): copied to disk, freed on exit."""
        run_id = self._worker_group.spec.rdzv_handler.get_run_id()
        settings, key = self._checkpoint_settings, None
        if settings.job_secret_file is not None and settings.peer_copies > 0:
            try:  # checked by the launcher; read here, never put in the workers' env
                key = await anyio.to_thread.run_sync(_read_job_secret, settings.job_secret_file)
            except ValueError as exc:
                raise AgentConfigError(f"job_secret_file: {exc}") from None
        async with open_checkpoints(run_id, settings, self._emit, key) as checkpoints:
            self._checkpoints = checkpoints
            try:
                yield
            finally:
                self._checkpoints = None

    def _open_round_progress(self, attempt_dir: str | None) -> RoundProgress:
        """This round's progress files (closed with the round): always, for the steps of
        the goodput ledger; with stacks dumps when hang detection or the file timer is on."""
        spec = self._worker_group.spec
        timeouts = self._progress_timeouts()
        wanted = spec.max_no_progress_restarts is not None or spec.learn_timeouts is not None
        dump = timeouts.enabled or wanted or self._file_timer is not None
        from ._hang import RoundProgress, stacks_files

        directory = self._progress_directory()
        ranks = list(range(spec.local_world_size))
        stacks = stacks_files(directory, self._attempt, attempt_dir if dump else None, ranks)
        progress = RoundProgress(directory, self._attempt, stacks, timeouts, dump)
        assert self._round_stack is not None
        self._round_stack.callback(self._close_round_progress, progress)
        self._progress = progress
        return progress

    def _progress_directory(self) -> str:
        if self._progress_dir is None:  # run() claims it; here only when called outside
            from ._hang import ProgressDirectory

            self._progress_dir = ProgressDirectory()
        return self._progress_dir.name

    def _open_timer_stacks(
        self, attempt_dir: str | None, progress: RoundProgress | None
    ) -> dict[int, str]:
        """With the file timer served: each worker's stacks file (hang detection's if on)."""
        if self._file_timer is None:
            return {}
        if progress is not None:
            return progress.stacks_files
        from ._hang import remove_empty_files, stacks_files

        ranks = list(range(self._worker_group.spec.local_world_size))
        stacks = stacks_files(self._progress_directory(), self._attempt, attempt_dir, ranks)
        assert self._round_stack is not None
        self._round_stack.callback(remove_empty_files, list(stacks.values()))
        return stacks

    def _stacks_env(self, progress: RoundProgress | None, rank: int) -> dict[str, str]:
        if progress is not None:
            return progress.env(rank)
        path = self._timer_stacks.get(rank)
        if path is None:
            return {}
        from ._hang import stacks_env

        return stacks_env(path)

    async def _capture_before_timer_kill(self, pid: int, scopes: list[str]) -> str | None:
        """A file timer expired: capture every local worker's stacks before the kill.

        Returns the expired worker's stacks file when its stacks were written. Bounded
        by the capture's timeouts; never raises for a worker that cannot be dumped.
        """
        procs, stacks = self._procs, self._timer_stacks
        if procs is None or not stacks:
            return None
        log.error(
            "file timer: scope(s) %s of worker pid %s expired: hung; capturing the stacks"
            " of every local worker",
            scopes,
            pid,
        )
        alive = procs.alive
        targets = {r: (p, stacks[r]) for r, p in alive.items() if r in stacks}
        from ._stacks import capture_stacks

        captured = await capture_stacks(targets)
        try:
            group = os.getpgid(pid)
        except OSError:
            group = pid
        rank = next((r for r, p in alive.items() if p in (pid, group)), None)
        return stacks[rank] if rank is not None and rank in captured else None

    def _close_round_progress(self, progress: RoundProgress) -> None:
        # the ledger keeps the round's steps: a run stopped now (a signal) still counts them
        self.goodput.round_closing(self._rank_steps())
        progress.close()
        self._progress = None

    def _worker_args(self, spec: WorkerSpec, local_rank: int) -> list[str]:
        entrypoint = spec.entrypoint
        if isinstance(entrypoint, str):
            return [entrypoint, *substitute_local_rank([str(a) for a in spec.args], local_rank)]
        assert entrypoint is not None
        if self._result_dir is None:
            self._result_dir = tempfile.TemporaryDirectory(prefix="aelastic_results_")
        path = os.path.join(self._result_dir.name, f"attempt_{self._attempt}_{local_rank}.json")
        self._result_files[local_rank] = path
        return list(callable_process_args(entrypoint, spec.args, result_file=path))

    async def _stop_on_round_exit(self) -> None:
        await self._stop_workers(self._worker_group, self._signal or signal.SIGTERM)
        self._procs = None

    @prof
    async def _stop_workers(
        self, worker_group: WorkerGroup, sig: signal.Signals = signal.SIGTERM
    ) -> None:
        procs = self._procs
        if procs is None:
            return
        if self._failed_before_stop is None:
            self._failed_before_stop = self._failed_on_their_own(procs)
        if self._warm_pool is not None and self._failed_before_stop:
            # the next workers will wait on the idle interpreters' imports: no more yielding
            self._warm_pool.hurry()
        with anyio.CancelScope(shield=True):
            await procs.stop(sig=sig, timeout=self._shutdown_timeout)

    def _failed_on_their_own(self, procs: WorkerProcesses) -> frozenset[int]:
        """Local ranks that failed before any stop signal: exited non-zero, or wrote error.json.

        Called right before the first stop signal of a round. A worker whose
        exit the loop has not delivered yet counts (``poll_exits``), and so does one
        still running whose ``@record`` already wrote its error file (it is tearing
        down after an uncaught exception; the signal may well end it first). One
        ``stat`` per running worker; never blocks for long.
        """
        procs.poll_exits()
        failed = {rank for rank, exit_ in procs.exits.items() if exit_.failed}
        for rank in procs.alive:
            path = self._error_files.get(rank)
            if path and os.path.isfile(path):
                failed.add(rank)
        return frozenset(failed)

    async def _wait_for_worker_exit(self, worker_group: WorkerGroup) -> None:
        assert self._procs is not None
        exit_ = await self._procs.wait_for_exit()
        self._exits[exit_.local_rank] = exit_

    def _worker_exit_codes(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        return {rank: e.exitcode for rank, e in self._exits.items()}

    def _unkillable_workers(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        return dict(self._procs.unreaped) if self._procs is not None else {}

    def _forward_signal(self, sig: signal.Signals) -> None:
        if self._procs is not None:
            self._procs.send_signal(sig)

    def _worker_states(self, worker_group: WorkerGroup) -> Mapping[int, str]:
        return self._procs.states() if self._procs is not None else {}

    def _failed_before_stop_codes(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        own, procs = self._failed_before_stop, self._procs
        if own is None or procs is None:
            return super()._failed_before_stop_codes(worker_group)
        codes = {rank: e.exitcode for rank, e in procs.exits.items() if rank in own}
        # failed through its error file, still running when stopped: not a success
        return {rank: codes.get(rank) or 1 for rank in own}

    def _stopped_exit_codes(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        if self._procs is None:
            return {}
        return {rank: e.exitcode for rank, e in self._procs.exits.items()}

    def _stderr_file(self, local_rank: int) -> str | None:
        """The file this round's worker ``local_rank`` writes its stderr to (None: the
        console)."""
        dests = self._log_destinations
        return None if dests is None else dests.stderrs.get(local_rank)

    @prof
    async def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        spec = worker_group.spec
        by_local = {w.local_rank: w for w in worker_group.workers}
        failures: dict[int, ProcessFailure] = {}
        exits: Mapping[int, ProcessExit] = self._exits
        own = self._failed_before_stop
        if own is not None and self._procs is not None:
            # Stopped: every worker that failed on its own, not only the exit that
            # triggered the stop; the ones our signal ended are not failures.
            exits = {r: e for r, e in self._procs.exits.items() if r in own or r in exits}
        for rank, exit_ in exits.items():
            if exit_.failed:
                failures[by_local[rank].global_rank] = ProcessFailure(
                    local_rank=rank,
                    pid=exit_.pid,
                    exitcode=exit_.exitcode,
                    error_file=self._error_files.get(rank),
                    exit_time=exit_.timestamp,
                    stderr_file=self._stderr_file(rank),
                )
        if failures:
            return RunResult(state=WorkerState.FAILED, failures=failures)
        if len(self._exits) < spec.local_world_size:
            return RunResult(state=WorkerState.HEALTHY)
        values: dict[int, Any] = {}
        for worker in worker_group.workers:
            path = self._result_files.get(worker.local_rank)
            values[worker.global_rank] = None if path is None else read_callable_result(path)
        return RunResult(state=WorkerState.SUCCEEDED, return_values=values)

    async def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        await self._stop_workers(self._worker_group, death_sig)
        if self._result_dir is not None:
            self._result_dir.cleanup()
            self._result_dir = None

    def idle_interpreters(self) -> tuple[int, int]:
        """How many warm interpreters are idle and their resident memory in bytes.

        ``(0, 0)`` without a warm pool. A few tiny ``/proc`` reads; never blocks.
        """
        pool = self._warm_pool
        return (0, 0) if pool is None else (len(pool.idle_pids), pool.idle_rss())

    def _predicted_worker(self, spec: WorkerSpec) -> tuple[list[str], dict[str, str], str] | None:
        """``(argv, env, cwd)`` of local rank 0 as :meth:`_start_workers` will build them,
        before any rendezvous (per-worker values are placeholders: the preload ignores
        them). None with ``virtual_local_rank`` (``CUDA_VISIBLE_DEVICES`` differs per worker).
        """
        if spec.virtual_local_rank or not isinstance(spec.entrypoint, str):
            return None
        env = worker_env(
            os.environ.copy(),
            local_rank=0,
            global_rank=0,
            role_rank=0,
            world_size=spec.local_world_size,
            role_world_size=spec.local_world_size,
            role=spec.role,
            local_world_size=spec.local_world_size,
            group_rank=0,
            group_world_size=1,
            master_addr="",
            master_port=0,
            restart_count=0,
            max_restarts=spec.max_restarts,
            run_id="",
            use_agent_store=False,
            error_file=None,
            extra=self._worker_env_extra,
        )
        argv = self._worker_args(spec, 0)
        return argv, env, self._worker_cwd or os.getcwd()

    @asynccontextmanager
    async def _open_warm_pool(self) -> AsyncIterator[None]:
        """Pre-start the Python workers' interpreters for the whole run (see aelastic.workers)."""
        spec = self._worker_group.spec
        entry = None
        if isinstance(spec.entrypoint, str) and self._warm_workers and warm_workers_enabled():
            entry = parse_python_argv([spec.entrypoint, *(str(a) for a in spec.args)])
        if entry is None:
            if spec.preload:
                log.warning(
                    "--preload has no effect here: only Python script and -m workers run in"
                    " warm interpreters (not callables, --no-python binaries, another"
                    " interpreter, or AELASTIC_WARM_WORKERS=0)"
                )
            yield
            return
        pool_cm = open_warm_pool(
            entry.prefix,
            spec.local_world_size,
            preload=spec.preload,
            preload_exclude=spec.preload_exclude,
            predicted_worker=self._predicted_worker(spec) if spec.preload else None,
        )
        async with pool_cm as pool:
            self._warm_pool = pool
            try:
                yield
            finally:
                self._warm_pool = None

    @asynccontextmanager
    async def _open_file_timer(self) -> AsyncIterator[None]:
        """torchrun's ``TORCHELASTIC_ENABLE_FILE_TIMER=1``: serve the workers' expiration timers."""
        if not file_timer_enabled(os.environ):
            yield
            return
        from ._file_timer import TIMER_FILE_ENV, serve_file_timer

        async with serve_file_timer(
            self._emit, os.environ.get(TIMER_FILE_ENV), self._capture_before_timer_kill
        ) as server:
            self._worker_env_extra[TIMER_FILE_ENV] = server.path
            self._file_timer = server
            try:
                yield
            finally:
                self._file_timer = None
                self._worker_env_extra.pop(TIMER_FILE_ENV, None)

    def _explain_failures(self, result: RunResult) -> None:
        if self._file_timer is not None:
            from ._file_timer import explain_expired

            explain_expired(result.failures.values(), self._file_timer)

    async def run(self, role: str = "default") -> RunResult:
        # hang detection's and the file timer's modules when the spec or env turns them on
        await import_features(feature_modules(self._worker_group.spec, os.environ))
        try:
            if self._progress_dir is None:
                from ._hang import open_progress_directory  # frees what killed agents left

                self._progress_dir = await anyio.to_thread.run_sync(open_progress_directory)
            async with self._open_warm_pool(), self._open_file_timer(), self._open_checkpoints():
                return await super().run(role)
        finally:
            if self._result_dir is not None:
                self._result_dir.cleanup()
                self._result_dir = None
            if self._progress_dir is not None:
                self._progress_dir.cleanup()
                self._progress_dir = None
            if self._log_run_dir is not None and self._worker_group.spec.log_dir is None:
                remove_empty_log_dirs(self._log_run_dir)  # a few rmdir calls: bounded


async def _resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to (none when it does not), resolved in a thread."""
    import socket

    try:
        infos = await anyio.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


async def _route_source(host: str) -> str | None:
    """The local address this node reaches ``host`` (a name or an address) from."""
    for address in await _resolve(host):
        source = route_source(address)
        if source is not None:
            return source
    return None
