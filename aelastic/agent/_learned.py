"""Learned timeouts: remember the longest healthy intervals of a run and tighten the
hang-detection timeouts to ``factor`` x them from the next restart on.

The observations (:class:`~aelastic.agent._policy.Observed`) are kept per run id in
``<log_dir>/<run_id>/learned_timeouts.json`` (the run id made a safe file name, as for
the logs; replaced atomically, since the nodes of a job may share the log dir) and,
when the rendezvous backend has a shared store (c10d), under
``aelastic/learned_timeouts/<run_id>`` so every node uses the longest interval any
node saw. The rules are plain functions in
:mod:`aelastic.agent._policy` (``observe``, ``merge_observed``, ``learned_timeouts``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Collection, Mapping
from typing import Any

import anyio
import anyio.to_thread

from ..metrics import put_metric
from ..progress._reader import ProgressSnapshot
from ..progress._timeouts import ProgressTimeouts
from ..store import StoreError
from ..workers._logs import run_dir
from ._policy import Observed, learned_timeouts, merge_observed, observe
from ._restart_policy import job_store
from ._types import WorkerSpec

__all__ = ("LearnedTimeouts",)

log = logging.getLogger("aelastic.agent")

_STORE_TIMEOUT = 10.0
_FILE_NAME = "learned_timeouts.json"


class LearnedTimeouts:
    """One agent's learned timeouts (off unless ``spec.learn_timeouts`` is a factor).

    ``emit(name, metadata)`` records an agent event (the agent stamps its identity).
    """

    def __init__(self, spec: WorkerSpec, emit: Callable[[str, Mapping[str, Any]], None]) -> None:
        self._spec = spec
        self._emit = emit
        self.observed = Observed()
        self._loaded = False

    @property
    def enabled(self) -> bool:
        return self._spec.learn_timeouts is not None

    def _path(self) -> str | None:
        log_dir = self._spec.log_dir
        if log_dir is None or os.fspath(log_dir) == os.devnull:
            return None
        return os.path.join(
            run_dir(os.fspath(log_dir), self._spec.rdzv_handler.get_run_id()), _FILE_NAME
        )

    def timeouts(self) -> ProgressTimeouts:
        """The timeouts for the next attempt (the configured ones while nothing is learned)."""
        configured = self._spec.progress_timeouts()
        factor = self._spec.learn_timeouts
        if factor is None:
            return configured
        return learned_timeouts(configured, self.observed, factor)

    async def update(self, snapshots: Collection[ProgressSnapshot]) -> None:
        """Fold one attempt's intervals in, merge with what was persisted, persist, record.

        Bounded (the store requests by 10 s). Errors: a persistence problem (file, store
        error or timeout, malformed data) is logged, never raised; the observations are
        still used by this agent. Cancellation: the store requests stop at once; a file
        write already begun finishes in its worker thread, and the file is replaced
        atomically, so it holds the old or the new observations, never a torn write.
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
                await anyio.to_thread.run_sync(_replace_file, path, payload)
        except (OSError, ValueError, TimeoutError, StoreError) as exc:
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
        self._emit(
            "aelastic.progress.learned_timeouts",
            {
                "heartbeat": timeouts.heartbeat,
                "sections": json.dumps(dict(timeouts.sections)),
                "factor": self._spec.learn_timeouts,
            },
        )


def _replace_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, then replace).

    Raises OSError; the temp file is removed on any failure.
    """
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".learned_", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            fp.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
