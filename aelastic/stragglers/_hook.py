"""The per-rank signal where CPU time says nothing (GPU jobs): a DDP communication hook
that times each rank's own work between its gradient all-reduces.

DDP calls a communication hook once per gradient bucket; the bucket that ends an
iteration's backward pass says so (``bucket.is_last()``). For that bucket the hook marks
when its gradients are ready and when its all-reduce completed. A rank's *own work* in
iteration k runs from the completion of iteration k-1's last all-reduce to the moment
iteration k's last bucket is ready (optimizer step, data, forward, backward); the rest of
the span between two completions is waiting for the slowest peer, plus the transfer. Each
iteration is reported with :func:`aelastic.progress.work_timed`, and the agent scores
``work / span`` the way it scores CPU busy time (the slow rank works the whole span, the
ranks waiting for it less).

* **CPU tensors (gloo):** the marks are ``time.monotonic_ns()``; the completion mark is
  taken in the all-reduce future's callback (on gloo's thread, as the future completes).
* **CUDA tensors (NCCL):** the marks are CUDA events. The ready event is recorded on the
  current stream when the hook runs, so it completes once the GPU computed the bucket's
  gradients; the completion event is recorded in the future's callback, whose current
  stream waits for the all-reduce. Their times are read with ``query()``, which never
  waits, at later iterations: the hook never synchronizes with the GPU, and the agent
  sees an iteration once the GPU finished it. No CUDA call is made in the agent.

Imports nothing at module level: torch is imported by :func:`time_work` in the worker.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..progress import work_timed

__all__ = ("WorkTimer", "time_work")

log = logging.getLogger("aelastic.stragglers")

#: Iterations waiting for their CUDA events; older ones are dropped (a GPU that far
#: behind has nothing useful to say about this rank's pace).
_MAX_PENDING = 256


class _Event(Protocol):
    """What the timer uses of a ``torch.cuda.Event(enable_timing=True)``."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...


Report = Callable[[int, int], None]


class WorkTimer:
    """Turns each iteration's two marks (last bucket ready, its all-reduce done) into a
    ``report(work_ns, span_ns)`` per iteration, from the second iteration on.

    ``WorkTimer()`` marks with ``clock()`` (the monotonic clock, ns);
    ``WorkTimer(event=...)`` with events made by ``event()``
    (``torch.cuda.Event(enable_timing=True)``), reported once they completed. Call
    :meth:`ready` then :meth:`done` once per iteration, in that order (:meth:`done` may
    run on another thread). Never raises but what ``report`` (or an event) raises.
    """

    def __init__(
        self,
        report: Report = work_timed,
        event: Callable[[], _Event] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.report = report
        self._event = event
        self._clock = clock
        self._ready_ns = 0
        self._done_ns = 0
        self._ready_event: _Event | None = None
        self._done_event: _Event | None = None
        #: CUDA: (previous done, ready, done) of iterations whose times are not known yet
        self.pending: collections.deque[tuple[_Event, _Event, _Event]] = collections.deque(
            maxlen=_MAX_PENDING
        )

    def ready(self) -> None:
        """The iteration's last bucket is ready (called in the hook, before its all-reduce)."""
        if self._event is None:
            self._ready_ns = self._clock()
            return
        self.resolve()
        event = self._ready_event = self._event()
        event.record()

    def done(self) -> None:
        """The iteration's last all-reduce completed (called in its future's callback)."""
        if self._event is None:
            now = self._clock()
            if self._done_ns and self._ready_ns:
                self.report(self._ready_ns - self._done_ns, now - self._done_ns)
            self._done_ns = now
            return
        event = self._event()
        event.record()
        if self._done_event is not None and self._ready_event is not None:
            self.pending.append((self._done_event, self._ready_event, event))
        self._done_event = event

    def resolve(self) -> None:
        """Report the iterations whose events completed, oldest first; never waits."""
        while self.pending and self.pending[0][2].query():
            previous, ready, done = self.pending.popleft()
            span = previous.elapsed_time(done) * 1e6  # ms
            self.report(int(previous.elapsed_time(ready) * 1e6), int(span))


class _Timed:
    """The hook's state: the wrapped hook and its state, and the timer (made at the
    first call, when the gradients' device is known)."""

    def __init__(self, hook: Callable[[Any, Any], Any], state: Any) -> None:
        self.hook = hook
        self.state = state
        self.timer: WorkTimer | None = None
        self.failed = False

    def mark(self, what: Callable[[WorkTimer], None]) -> None:
        """Run one mark; a failing timer is switched off (logged once), never the step."""
        if self.failed or self.timer is None:
            return
        try:
            what(self.timer)
        except Exception as exc:
            self.failed = True
            log.warning("straggler work timing switched off: %s: %s", type(exc).__name__, exc)


def _timed_hook(state, bucket):  # type: ignore[no-untyped-def]
    # No annotations: DDP accepts only torch's own classes there, or none.
    if not bucket.is_last():
        return state.hook(state.state, bucket)
    if state.timer is None:
        state.timer = _timer_for(bucket.buffer())
    state.mark(WorkTimer.ready)
    future = state.hook(state.state, bucket)

    def completed(fut):  # type: ignore[no-untyped-def]
        value = fut.value()  # the wrapped hook's result (raises its error)
        state.mark(WorkTimer.done)
        return value

    return future.then(completed)


def _timer_for(buffer: Any) -> WorkTimer:
    if not buffer.is_cuda:
        return WorkTimer()
    import torch

    return WorkTimer(event=lambda: torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]


def time_work(model: Any, hook: Callable[[Any, Any], Any] | None = None, state: Any = None) -> None:
    """Time this rank's own work between the gradient all-reduces of the DDP ``model``, for
    straggler detection: one line after wrapping the model, on every rank.

    Needed where CPU time does not show a rank's work (GPU jobs: a rank waiting for its
    peers in NCCL looks as busy as the one it waits for); CPU (gloo) jobs are measured
    without it, but may use it too. ``hook`` and ``state``: the communication hook the
    model would use otherwise (default: torch's ``allreduce_hook``, what DDP does without
    a hook), called for every bucket with its result unchanged. Costs two clock reads
    (CPU) or two CUDA events (GPU) per iteration; never synchronizes with the GPU; a
    no-op outside an agent's worker but for the hook's own call.

    Raises ``TypeError`` when ``model`` is not a ``DistributedDataParallel`` model, and
    torch's error when a communication hook was registered already (DDP takes one: pass
    it here instead).
    """
    register = getattr(model, "register_comm_hook", None)
    if register is None:
        raise TypeError(
            f"time_work: {type(model).__name__} is not a DistributedDataParallel model;"
            " pass the model returned by torch.nn.parallel.DistributedDataParallel(...)"
        )
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook = allreduce_hook
    register(_Timed(hook, state), _timed_hook)
