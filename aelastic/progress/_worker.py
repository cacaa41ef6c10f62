"""The worker side: ``heartbeat()``, ``section()``, ``step()`` over the shared progress file.

Attaches when this module is first imported in a worker the agent started with
hang detection on (``AELASTIC_PROGRESS_FILE`` set): the file is mapped and marked
attached, and from then on the agent judges this worker by the timeouts it was
given. Attaching removes ``AELASTIC_PROGRESS_FILE`` (and the stacks variables) from
``os.environ``, so processes the worker starts (spawned data loader workers,
``mp.spawn``) never report for it. Outside such a worker (no variable, an unreadable
file) every call is a no-op, so a script runs unchanged under torchrun or on its own.

Steady state costs no system call: each call stores a few integers into the
mapping (``time.monotonic_ns()`` is served by the vDSO). Not thread-safe across
sections: sections are meant for one (the training) thread; ``heartbeat()`` and
``step()`` may be called from any thread.
"""

from __future__ import annotations

import functools
import mmap
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .._stacks_dump import register_from_env
from . import _layout as L

__all__ = ("attached", "checkpoint_blocked", "heartbeat", "section", "step", "work_timed")

_F = TypeVar("_F", bound=Callable[..., Any])

_now = time.monotonic_ns
_slots: memoryview | None = None
_map: mmap.mmap | None = None
_name_ids: dict[str, int] = {}
#: Open sections, innermost last: (index, entered_ns).
_open: list[tuple[int, int]] = []
#: Whether the worker called step() itself (then a checkpoint's step is not counted).
_own_steps = False


def _attach() -> None:
    global _slots, _map
    # Taken out of os.environ: a process this worker starts (a spawned data loader
    # worker, mp.spawn, a subprocess) must not attach to our file, reset our step and
    # heartbeat for us while we hang.
    path = os.environ.pop(L.FILE_ENV, None)
    if not path:
        return
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size < L.SIZE:
            return
        _map = mmap.mmap(fd, L.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    slots = memoryview(_map).cast("B").cast("q")
    now = _now()
    slots[L.STEP] = -1
    slots[L.ATTACH_NS] = now
    slots[L.ATTACHED] = L.MAGIC
    _slots = slots
    # A forked child (e.g. a fork-started data loader worker) must not speak for us.
    os.register_at_fork(after_in_child=_detach)
    _on_exit(_script_ended)
    # Fresh interpreters (no warm pool) register the stacks dump here; a no-op when the
    # warm bootstrap did already.
    register_from_env()


def _on_exit(fn: Callable[[], None]) -> None:
    """Call ``fn`` when the interpreter starts its shutdown: right after the script ended,
    before non-daemon threads are joined and ``atexit`` handlers run (threading's own
    exit hooks, private but there since Python 3.9); plain ``atexit`` otherwise."""
    import threading

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(fn)
    except RuntimeError:  # no such hook, or the shutdown already began
        import atexit

        atexit.register(fn)


def _script_ended() -> None:
    """Mark the file: the script ended, the interpreter exits (the agent stops judging
    this worker: a slow teardown is not a hang; ``--exit-grace`` bounds it)."""
    s = _slots
    if s is not None:
        s[L.ENDED_NS] = _now()


def _detach() -> None:
    global _slots, _map
    _slots = None
    _map = None
    _open.clear()


def attached() -> bool:
    """Whether the agent judges this worker's progress (a hang-detection timeout is on)."""
    return _slots is not None


def heartbeat() -> None:
    """Tell the agent this worker is alive and making progress (~0.3 us, no system call)."""
    s = _slots
    if s is None:
        return
    now = _now()
    # Literal slot numbers (layout: BEATS=2, LAST_BEAT_NS=3, MAX_GAP_NS=4): the hot path.
    gap = now - s[3]
    if gap > s[4] and s[2]:
        s[4] = gap
    s[3] = now
    s[2] += 1


if (L.BEATS, L.LAST_BEAT_NS, L.MAX_GAP_NS) != (2, 3, 4):  # pragma: no cover
    raise ImportError("aelastic.progress: heartbeat() slot numbers disagree with the layout")


def step(value: int | None = None) -> None:
    """Report training progress: ``step(n)`` sets the step (e.g. the global iteration,
    resumed from a checkpoint), ``step()`` adds one. Also a heartbeat.

    The agent compares the highest step of each attempt with the best one before it
    to stop a job that keeps restarting without progress (``--max-no-progress-restarts``).
    """
    global _own_steps
    _own_steps = True
    _step(value)


def _step(value: int | None) -> None:
    s = _slots
    if s is None:
        return
    s[L.STEP] = s[L.STEP] + 1 if value is None else int(value)
    now = s[L.STEP_NS] = _now()
    if not s[L.FIRST_STEP_NS]:  # the goodput ledger's start of stepping
        s[L.FIRST_STEP] = s[L.STEP]
        s[L.FIRST_STEP_NS] = now
    heartbeat()


def checkpoint_blocked(kind: str, ns: int, step: int | None = None) -> None:
    """Add ``ns`` nanoseconds this rank blocked saving (``kind="save"``) or loading
    (``"load"``) a checkpoint: the goodput ledger's ``checkpoint_save`` / ``_load``.
    ``step``: the step a save holds, counted as the worker's step unless the worker
    calls :func:`step` itself.

    ``aelastic.checkpoint`` reports its own; call it around another checkpoint library's
    blocking save or load. A no-op outside an agent's worker.
    """
    s = _slots
    if s is None:
        return
    slot = {"save": L.CKPT_SAVE_NS, "load": L.CKPT_LOAD_NS}.get(kind)
    if slot is None:
        raise ValueError(f"checkpoint_blocked: kind={kind!r}; use 'save' or 'load'")
    s[slot] += max(0, int(ns))
    if step is not None and kind == "save" and not _own_steps:
        _step(step)


def work_timed(work_ns: int, span_ns: int) -> None:
    """Add ``span_ns`` nanoseconds of wall time of which this rank spent ``work_ns`` on its
    own work, the rest waiting for its peers (in a collective).

    The straggler detection's signal where CPU time says nothing (GPU jobs): with any
    measurement reported, the agent scores this rank by ``work / span`` instead of its CPU
    time. :func:`aelastic.stragglers.time_work` reports it for a DDP model; call it
    yourself around other collectives (FSDP, hand-written ones), every rank alike.
    Call it from one thread at a time. A no-op outside an agent's worker.
    """
    s = _slots
    if s is None or span_ns <= 0:
        return
    s[L.WORK_NS] += min(max(0, int(work_ns)), int(span_ns))
    s[L.WORK_SPAN_NS] += int(span_ns)  # written last: the agent pairs it with the work


def _name_id(name: str) -> int:
    index = _name_ids.get(name)
    if index is not None:
        return index
    assert _map is not None and _slots is not None
    count = _slots[L.NAMES]
    if count >= L.MAX_NAMES:
        raise ValueError(
            f"aelastic.progress: more than {L.MAX_NAMES} distinct section names; reuse names"
            " (a name identifies a kind of work, e.g. 'forward' or 'checkpoint')"
        )
    raw = name.encode()[: L.NAME_SIZE - 8]
    offset = L.NAMES_OFFSET + count * L.NAME_SIZE
    _map[offset : offset + len(raw)] = raw
    _slots[L.NAMES] = count + 1  # published after the name is in place
    _name_ids[name] = count + 1
    return count + 1


def _enter(name: str) -> None:
    s = _slots
    if s is None:
        return
    index = _name_id(name)
    now = _now()
    _open.append((index, now))
    s[L.SECTION_NS] = now
    s[L.SECTION] = index


def _exit() -> None:
    s = _slots
    if s is None or not _open:
        return
    index, entered = _open.pop()
    now = _now()
    assert _map is not None
    longest = L.NAMES_OFFSET + (index - 1) * L.NAME_SIZE + L.NAME_SIZE - 8
    record = memoryview(_map)[longest : longest + 8].cast("q")
    if now - entered > record[0]:
        record[0] = now - entered
    if _open:
        outer, outer_entered = _open[-1]
        s[L.SECTION_NS] = outer_entered
        s[L.SECTION] = outer
    else:
        s[L.SECTION] = 0
    s[L.SECTION_EXIT_NS] = now


class section:
    """Mark a named stretch of work, as a context manager or a decorator.

    Inside a section whose name has a timeout (``--section-timeouts name=seconds``)
    that timeout replaces the heartbeat timeouts; outside every section the
    out-of-section timeout applies (once sections were used). Sections nest; the
    innermost one counts. A no-op when the agent does not judge this worker.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"section name must be a non-empty string, got {name!r}")
        self.name = name

    def __enter__(self) -> section:
        _enter(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        _exit()

    def __call__(self, fn: _F) -> _F:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                _exit()

        return wrapper  # type: ignore[return-value]


_attach()
