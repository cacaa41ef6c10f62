"""Learned timeouts: remember the longest healthy intervals of a run and tighten the
hang-detection timeouts to ``factor`` x them from the next restart on.

The observations (:class:`~aelastic.agent._policy.Observed`) are kept per run id in
``<log_dir>/<run_id>/learned_timeouts.json`` and, when the rendezvous backend has a
shared store (c10d), under ``aelastic/learned_timeouts/<run_id>`` so every node
uses the longest interval any node saw. The rules are plain functions in
:mod:`aelastic.agent._policy` (``observe``, ``merge_observed``, ``learned_timeouts``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Collection

import anyio

from ..events import Event, EventSource
from ..metrics import put_metric
from ..progress import ProgressSnapshot, ProgressTimeouts
from ._policy import Observed, learned_timeouts, merge_observed, observe
from ._restart_policy import job_store
from ._types import WorkerSpec

__all__ = ("LearnedTimeouts",)

log = logging.getLogger("aelastic.agent")

_STORE_TIMEOUT = 10.0
_FILE_NAME = "learned_timeouts.json"


class LearnedTimeouts:
    """One agent's learned timeouts (off unless ``spec.learn_timeouts`` is a factor)."""

    def __init__(self, spec: WorkerSpec, record: Callable[[Event], None]) -> None:
        self._spec = spec
        self._record = record
        self.observed = Observed()
        self._loaded = False

    @property
    def enabled(self) -> bool:
        return self._spec.learn_timeouts is not None

    def _path(self) -> str | None:
        log_dir = self._spec.log_dir
        if log_dir is None or os.fspath(log_dir) == os.devnull:
            return None
        return os.path.join(os.fspath(log_dir), self._spec.rdzv_handler.get_run_id(), _FILE_NAME)

    def timeouts(self) -> ProgressTimeouts:
        """The timeouts for the next attempt (the configured ones while nothing is learned)."""
        configured = self._spec.progress_timeouts()
        factor = self._spec.learn_timeouts
        if factor is None:
            return configured
        return learned_timeouts(configured, self.observed, factor)

    async def update(self, snapshots: Collection[ProgressSnapshot]) -> None:
        """Fold one attempt's intervals in, merge with what was persisted, persist, record.

        Bounded (the store requests by 10 s); a persistence problem is logged, never raised.
        """
        if not self.enabled:
            return
        before = self.timeouts()
        merged = merge_observed(self.observed, observe(snapshots))
        key = f"aelastic/learned_timeouts/{self._spec.rdzv_handler.get_run_id()}"
        store = job_store(self._spec.rdzv_handler)
        path = self._path()
        try:
            if not self._loaded and path is not None and await anyio.Path(path).exists():
                text = await anyio.Path(path).read_text()
                merged = merge_observed(merged, Observed.from_json(json.loads(text)))
            self._loaded = True
            with anyio.fail_after(_STORE_TIMEOUT):
                if store is not None and await store.check([key]):
                    shared = Observed.from_json(json.loads(await store.get(key)))
                    merged = merge_observed(merged, shared)
                payload = json.dumps(merged.to_json())
                if store is not None:
                    await store.set(key, payload)
            if path is not None:
                await anyio.Path(path).parent.mkdir(parents=True, exist_ok=True)
                await anyio.Path(path).write_text(payload)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("could not persist the learned timeouts: %s", exc)
        self.observed = merged
        after = self.timeouts()
        if after != before:
            self._announce(after)

    def _announce(self, timeouts: ProgressTimeouts) -> None:
        log.info(
            "[%s] learned timeouts (x%s the longest healthy interval), used from the next"
            " restart: heartbeat %s s, sections %s",
            self._spec.role,
            self._spec.learn_timeouts,
            timeouts.heartbeat,
            timeouts.sections,
        )
        if timeouts.heartbeat is not None:
            put_metric("progress.learned_heartbeat_timeout_ms", int(timeouts.heartbeat * 1000))
        self._record(
            Event(
                "aelastic.progress.learned_timeouts",
                source=EventSource.AGENT,
                timestamp=int(time.time() * 1000),
                metadata={
                    "heartbeat": timeouts.heartbeat,
                    "sections": json.dumps(dict(timeouts.sections)),
                    "factor": self._spec.learn_timeouts,
                },
            )
        )
