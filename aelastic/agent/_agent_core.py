"""The state every phase of :class:`~aelastic.agent.SimpleElasticAgent` shares, and the
hooks its subclasses implement.

:class:`AgentCore` is the agent's base: its constructor sets every attribute the phase
modules read (``_agent_rendezvous``, ``_agent_start``, ``_agent_monitor``,
``_agent_exit``), so each is declared once, here. The hooks are torch's
SimpleElasticAgent's four (``_start_workers``, ``_stop_workers``, ``_monitor_workers``,
``_shutdown``) and the ones that let a subclass learn of an exit as it happens; each
says how it may fail. Nothing here blocks the event loop.
"""

from __future__ import annotations

import abc
import os
import signal
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from ..errors import ProcessFailure
from ..goodput._ledger import RankSteps
from ..goodput._recorder import GoodputRecorder
from ..metrics import prof
from ..rendezvous import RendezvousInfo
from ..store import Store
from ._exceptions import AgentError
from ._policy import UNINTERRUPTIBLE_STATE_TIMEOUT_ENV, resolve_uninterruptible_state_timeout
from ._restart_policy import RestartPolicy
from ._round_gate import RoundGate
from ._telemetry import AgentTelemetry
from ._types import RunResult, WorkerGroup, WorkerSpec, WorkerState

if TYPE_CHECKING:  # imported with hang detection only (see aelastic._features)
    from ._hang import Hang, RoundProgress
    from ._learned import LearnedTimeouts

__all__ = ("PEER_FINISHED_CHECK_TIMEOUT", "PEER_FINISHED_KEY", "AgentCore", "agent_prof")

_F = TypeVar("_F", bound=Callable[..., Any])

#: Set in the round's store by a node whose workers all succeeded, before its exit
#: barrier: its peers then know its departure ends the job, not the round's membership.
PEER_FINISHED_KEY = "aelastic/agent/peer_finished"
#: Bound on writing or reading the finished mark (a lost store must not hold a node).
PEER_FINISHED_CHECK_TIMEOUT = 5.0


def agent_prof(fn: _F) -> _F:
    """``@prof`` for a method of a phase class, named ``SimpleElasticAgent.<method>`` in the
    metrics (torch's names, and this package's before the agent was split by phase)."""
    fn.__qualname__ = f"SimpleElasticAgent.{fn.__name__}"
    return prof(fn)


class AgentCore(AgentTelemetry, abc.ABC):
    """The agent's state (set by the constructor) and its subclass hooks.

    ``exit_barrier_timeout``, ``shutdown_timeout`` and ``uninterruptible_state_timeout``
    override the spec's values.

    Raises:
        AgentConfigError: the D-state timeout (or its variable) is not a number.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        exit_barrier_timeout: float | None = None,
        shutdown_timeout: float | None = None,
        uninterruptible_state_timeout: float | None = None,
    ) -> None:
        self._worker_group = WorkerGroup(spec)
        self._remaining_restarts = spec.max_restarts
        self._store: Store | None = None
        self._exit_barrier_timeout = (
            spec.exit_barrier_timeout if exit_barrier_timeout is None else exit_barrier_timeout
        )
        self._shutdown_timeout = (
            spec.shutdown_timeout if shutdown_timeout is None else shutdown_timeout
        )
        #: set when this node left the exit barrier before its peers' workers finished:
        #: they are still running, so nothing at this node's end should wait for them
        self._peers_still_running = False
        self._total_execution_time = 0
        #: Worker starts so far (names callable result files; logs use the restart count).
        self._attempt = -1
        self._round_stack: AsyncExitStack | None = None
        #: opens the next round's stack inside :meth:`_invoke_run`'s block
        self._open_round: Callable[[], AsyncExitStack] = AsyncExitStack
        self._run_scope: anyio.CancelScope | None = None
        self._signal: signal.Signals | None = None
        self._running = False
        self._use_agent_store = False
        # the workers' store endpoint group rank 0 opened for this round (_rendezvous)
        self._store_endpoint: tuple[str, int, bool] | None = None
        self._rdzv_info: RendezvousInfo | None = None
        #: Seconds a worker may stay in D-state; None: the check is off (no polling).
        self._uninterruptible_state_timeout = resolve_uninterruptible_state_timeout(
            spec.uninterruptible_state_timeout
            if uninterruptible_state_timeout is None
            else uninterruptible_state_timeout,
            os.environ.get(UNINTERRUPTIBLE_STATE_TIMEOUT_ENV),
        )
        #: ``{local_rank: pid}`` of the workers the D-state check found stuck.
        self._stuck: dict[int, int] = {}
        #: This round's progress files (set by subclasses that start workers; None: off).
        self._progress: RoundProgress | None = None
        #: The hang that ended this round, if one did.
        self._hang: Hang | None = None
        #: The failed workers of the last failed round, published once they are stopped.
        self._last_failures: Mapping[int, ProcessFailure] = MappingProxyType({})
        self._restart_policy = RestartPolicy(spec)
        #: Learned timeouts (``spec.learn_timeouts``), made at first use (_learned_timeouts).
        self._learned: LearnedTimeouts | None = None
        #: Health checks run before each round (None: none); see :mod:`aelastic.nodes`.
        self.node_gate: RoundGate | None = None
        #: The exits the default (polling) _wait_for_worker_exit saw in this round.
        self._polled_exit_codes: Mapping[int, int] = {}
        #: Where this node's time went (:mod:`aelastic.goodput`), fed by the loop below.
        self.goodput = GoodputRecorder()
        self.goodput.steps = self._rank_steps

    # -- hooks for subclasses ------------------------------------------------------------

    @abc.abstractmethod
    async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start ``local_world_size`` workers; return ``{local_rank: worker id}``.

        Put the started processes' context on ``self._round_stack``.
        """

    @abc.abstractmethod
    async def _stop_workers(
        self, worker_group: WorkerGroup, sig: signal.Signals = signal.SIGTERM
    ) -> None:
        """Stop every worker (``sig``, SIGKILL after the shutdown timeout) and reap them.

        Must cope with workers already gone; safe to call twice.
        """

    async def _wait_for_worker_exit(self, worker_group: WorkerGroup) -> None:
        """Return when one more local worker has exited (the moment it does).

        This default is torch's polling SimpleElasticAgent, for subclasses that only implement
        :meth:`_monitor_workers`: it calls it every ``spec.monitor_interval`` seconds
        and returns once the group is no longer ``HEALTHY`` (its exit codes then come
        from that result, see :meth:`_worker_exit_codes`). Subclasses that learn of an
        exit as it happens override both.

        Raises:
            AgentError: ``_monitor_workers`` reported a state the agent cannot act on
                (``UNKNOWN``, ``INIT``...).
        """
        while True:
            await anyio.sleep(worker_group.spec.monitor_interval)
            result = await self._monitor_workers(worker_group)
            state = result.state
            if state is WorkerState.HEALTHY:
                continue
            if state is WorkerState.SUCCEEDED:
                codes = {w.local_rank: 0 for w in worker_group.workers}
            elif state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
                failed = {f.local_rank: f.exitcode or 1 for f in result.failures.values()}
                codes = failed or {w.local_rank: 1 for w in worker_group.workers}
            else:
                raise AgentError(
                    f"[{worker_group.spec.role}] _monitor_workers reported the worker group"
                    f" in state {state.value}; expected HEALTHY, SUCCEEDED, FAILED or UNHEALTHY"
                )
            self._polled_exit_codes = codes
            return

    def _worker_exit_codes(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        """``{local_rank: exitcode}`` of the workers exited so far in this round.

        This default reports what the polling :meth:`_wait_for_worker_exit` saw.
        """
        return self._polled_exit_codes

    @abc.abstractmethod
    async def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """The group's result now (no waiting): HEALTHY, FAILED+failures, SUCCEEDED+values.

        On a failure for good it is called after :meth:`_stop_workers`: FAILED then
        lists every worker that failed on its own, not the ones the stop ended.
        """

    @abc.abstractmethod
    async def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        """Release what the agent holds outside a round; called once at the end of every
        :meth:`run` (``death_sig``: the terminating signal, else SIGTERM)."""

    def _explain_failures(self, result: RunResult) -> None:
        """Amend the failures' messages with what only the agent knows (default: nothing)."""

    def _unkillable_workers(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        """``{local_rank: pid}`` of stopped workers that could not be reaped (default none)."""
        return {}

    def _forward_signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the running workers without stopping them (default: nothing)."""

    def _worker_states(self, worker_group: WorkerGroup) -> Mapping[int, str]:
        """``{local_rank: state letter}`` of the running workers (``"D"``: uninterruptible).

        Read by the opt-in D-state check only; the default reports nothing (never stuck).
        Must not block: it runs in the event loop.
        """
        return {}

    def _stopped_exit_codes(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        """``{local_rank: exitcode}`` of every worker reaped so far, stopped ones included."""
        return self._worker_exit_codes(worker_group)

    def _failed_before_stop_codes(self, worker_group: WorkerGroup) -> Mapping[int, int]:
        """After :meth:`_stop_workers`: ``{local_rank: exitcode}`` of the workers that
        failed on their own before the stop signal (default: the non-zero exits seen)."""
        codes = self._worker_exit_codes(worker_group)
        return {rank: code for rank, code in codes.items() if code != 0}

    def _rank_steps(self) -> list[RankSteps]:
        """The running round's steps per local rank, as the goodput ledger reads them."""
        progress = self._progress
        if progress is None:
            return []
        return [
            RankSteps(
                s.first_step,
                s.first_step_ns,
                s.step,
                s.step_ns,
                s.checkpoint_save_ns,
                s.checkpoint_load_ns,
            )
            if s.attached
            else RankSteps()
            for s in progress.snapshots().values()
        ]

    # -- provided by the phases (declared once here for the type checker) ---------------

    @abc.abstractmethod
    async def _rendezvous(self, worker_group: WorkerGroup) -> None:
        """Join the next round and assign ranks (see ``_agent_rendezvous``)."""

    @abc.abstractmethod
    def _hang_result(self, wg: WorkerGroup, hang: Hang) -> RunResult:
        """The FAILED result of a hung round (see ``_agent_monitor``)."""
