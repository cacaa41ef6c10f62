"""Restart policy by failure kind: the job-wide budget, the no-progress stop, the back-off.

:class:`RestartPolicy` reviews each decision of the state machine before it is
carried out; the rules themselves are the plain functions of
:mod:`aelastic.agent._policy` (``decide_job_budget``, ``fold_attempt_steps``,
``no_progress``, ``restart_backoff``). All off by default (torchrun's behaviour).
"""

from __future__ import annotations

import json
import logging

import anyio

from ..metrics import put_metric
from ..rendezvous import RendezvousHandler
from ..store import Store, StoreError
from ._exceptions import AgentError
from ._policy import (
    NO_PROGRESS_EXIT_CODE,
    Action,
    Decision,
    StepProgress,
    decide_job_budget,
    fold_attempt_steps,
    no_progress,
    restart_backoff,
)
from ._types import WorkerSpec, WorkerState

__all__ = ("RestartPolicy", "job_store")

log = logging.getLogger("aelastic.agent")

#: Bound on the store requests of the job-wide budget.
_STORE_TIMEOUT = 30.0
_KEY_PREFIX = "aelastic/job_restarts"


def job_store(handler: RendezvousHandler) -> Store | None:
    """The rendezvous' job-wide store (c10d's ``handler.store``), or None when it has none."""
    try:
        store = getattr(handler, "store", None)
    except Exception:  # not started, or gone
        return None
    return store if isinstance(store, Store) else None


class RestartPolicy:
    """The restart rules of one agent run (state: best step, failure streaks)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self._spec = spec
        self.steps = StepProgress()
        self.consecutive_failures = 0
        #: Set when the no-progress rule stopped the job (``aelastic run`` exits 93).
        self.stopped_for_no_progress = False
        self._warned_no_store = False
        self._warned_no_steps = False

    async def review(self, decision: Decision, *, attempt_best_step: int, round_: int) -> Decision:
        """The decision to carry out after this round's ``decision``.

        Folds the round's highest step in; a restart becomes FAIL when the no-progress
        limit is reached (only once a step was seen) or the job-wide budget is spent
        (a failed round is added to the store's set of failed rounds in one
        compare-and-set, bounded by 30 s).

        Cancellation: safe at any point; the job-wide count is idempotent per round, so
        a node cancelled mid-request loses nothing (a peer or a retry records the round).

        Raises:
            AgentError: the job-wide budget's store did not answer in time or failed.
        """
        spec = self._spec
        action = decision.action
        progressed = attempt_best_step > self.steps.best
        if action in (Action.RESTART, Action.FAIL, Action.REJOIN):
            failed = action is not Action.REJOIN
            self.steps = fold_attempt_steps(self.steps, attempt_best_step, failed=failed)
        if action is Action.REJOIN:
            self.consecutive_failures = 0
        if action is not Action.RESTART:
            return decision
        # Back-off grows while the group crash-loops; an attempt that made progress resets it.
        self.consecutive_failures = 1 if progressed else self.consecutive_failures + 1
        if spec.max_no_progress_restarts is not None and self.steps.best < 0:
            if not self._warned_no_steps:
                self._warned_no_steps = True
                log.warning(
                    "[%s] --max-no-progress-restarts is set but the workers never called"
                    " aelastic.progress.step(): the no-progress stop stays off until they do",
                    spec.role,
                )
        elif no_progress(self.steps, spec.max_no_progress_restarts):
            self.stopped_for_no_progress = True
            log.error(
                "[%s] %d consecutive failed attempts without step progress (best step %d):"
                " stopping the job (exit code %d: do not requeue)",
                spec.role,
                self.steps.streak,
                self.steps.best,
                NO_PROGRESS_EXIT_CODE,
            )
            put_metric(f"workers.{spec.role}.no_progress_stop", 1)
            return Decision(Action.FAIL, WorkerState.FAILED, 0)
        if spec.job_wide_restarts:
            return await self._job_budget(decision, round_)
        return decision

    async def _job_budget(self, decision: Decision, round_: int) -> Decision:
        spec = self._spec
        store = job_store(spec.rdzv_handler)
        if store is None:
            if not self._warned_no_store:
                self._warned_no_store = True
                log.warning(
                    "[%s] --job-wide-restarts needs a rendezvous backend with a job-wide store"
                    " (c10d); %s has none: counting this node's failures only",
                    spec.role,
                    spec.rdzv_handler.get_backend(),
                )
            return decision
        key = f"{_KEY_PREFIX}/{spec.rdzv_handler.get_run_id()}/failed_round_set"
        try:
            with anyio.fail_after(_STORE_TIMEOUT):
                failed_rounds = await _add_failed_round(store, key, round_)
        except (TimeoutError, StoreError) as exc:
            reason = (
                f"did not answer within {_STORE_TIMEOUT:g} s"
                if isinstance(exc, TimeoutError)
                else f"failed: {exc}"
            )
            raise AgentError(
                f"[{spec.role}] --job-wide-restarts: the rendezvous store {store!r} {reason}"
                f" while counting the job's failed rounds (key {key!r}); check that the"
                " rendezvous endpoint is up, or drop --job-wide-restarts to count this"
                " node's failures only"
            ) from None
        reviewed = decide_job_budget(failed_rounds, spec.max_restarts)
        log.info(
            "[%s] job-wide restart budget: %d of %d failed rounds spent",
            spec.role,
            failed_rounds,
            spec.max_restarts,
        )
        return reviewed

    def backoff_seconds(self) -> float:
        """How long to wait before this restart (0 unless ``restart_backoff`` is set)."""
        spec = self._spec
        return restart_backoff(
            self.consecutive_failures, spec.restart_backoff, spec.restart_backoff_max
        )


async def _add_failed_round(store: Store, key: str, round_: int) -> int:
    """Add ``round_`` to the JSON set of failed rounds at ``key``; return the set's size.

    One compare-and-set per attempt, so the count is atomic and idempotent: every node
    of a failed round may add it, any number of times, and it counts once; a request
    cancelled midway either landed whole or not at all.

    Raises:
        AgentError: ``key`` holds something other than a JSON list of rounds.
    """
    current = b""
    while True:
        try:
            rounds = set(json.loads(current)) if current else set()
        except (ValueError, TypeError):
            raise AgentError(
                f"the job-wide restart budget at store key {key!r} is not a JSON list of"
                f" rounds: {current[:100]!r}; use a fresh run id"
            ) from None
        if round_ in rounds:
            return len(rounds)
        desired = json.dumps(sorted(rounds | {round_})).encode()
        got = await store.compare_set(key, current, desired)
        if got == desired:
            return len(rounds) + 1
        # Another node changed it first (or it vanished: start over from empty).
        current = b"" if got == current else got
