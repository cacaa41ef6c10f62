"""Kubeflow Trainer's status server: post the job's progress where a TrainJob asks for it.

Kubeflow Trainer (v2.2+, ``TrainJobStatus`` feature gate) gives every trainer pod
three variables: ``KUBEFLOW_TRAINER_SERVER_URL`` (an HTTPS endpoint,
``.../namespaces/<ns>/trainjobs/<name>/status``), ``KUBEFLOW_TRAINER_SERVER_CA_CERT``
(the file of the CA that signed the server's certificate) and
``KUBEFLOW_TRAINER_SERVER_TOKEN`` (the file of a projected service-account token, a JWT
that the kubelet rotates). A ``POST`` of ``{"trainerStatus": {...}}`` with
``Authorization: Bearer <token>`` lands in ``TrainJob.status.trainerStatus``; clients
are asked to post at most once every 5 seconds.

:class:`TrainerStatusPoster` posts, from the node of group rank 0 only, the local
workers' newest complete step, the node's goodput ratio and, when
``AELASTIC_TOTAL_STEPS`` gives the run's length, the percentage done and the seconds
left. Every post is bounded (:data:`POST_TIMEOUT`) and runs in a worker thread, so a
server that hangs or refuses never holds the job; the first failure is logged as a
warning, later ones at debug level, and none is raised. The CA and the token are read
from their files at each post (both rotate).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import anyio
import anyio.abc

from .._numbers import positive_number

__all__ = (
    "INTERVAL",
    "INTERVAL_ENV",
    "POST_TIMEOUT",
    "TOTAL_STEPS_ENV",
    "TrainerStatusPoster",
    "TrainerStatusTarget",
    "post_status",
    "status_payload",
)

log = logging.getLogger("aelastic.schedulers")

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
#: The run's length in steps (optional): with it, the posts carry a percentage and an ETA.
TOTAL_STEPS_ENV = "AELASTIC_TOTAL_STEPS"
#: Seconds between two posts (Kubeflow asks for at least 5); a smaller value is for tests.
INTERVAL_ENV = "AELASTIC_TRAINER_STATUS_INTERVAL"
INTERVAL = 5.0
#: The least interval accepted from :data:`INTERVAL_ENV`.
MIN_INTERVAL = 0.1
#: Seconds one post may take, connection and TLS handshake included.
POST_TIMEOUT = 5.0


@dataclass(frozen=True)
class TrainerStatusTarget:
    """Where to post: the endpoint, the CA file (None: the system's CAs) and the token
    file (None: no ``Authorization`` header); :meth:`from_env` reads them."""

    url: str
    ca_file: str | None = None
    token_file: str | None = None
    total_steps: int | None = None
    interval: float = INTERVAL

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrainerStatusTarget | None:
        """The target Kubeflow Trainer set in ``env`` (default ``os.environ``); None when
        ``KUBEFLOW_TRAINER_SERVER_URL`` is unset or empty. Bad optional values
        (``AELASTIC_TOTAL_STEPS``, the interval) are logged and ignored: reporting
        progress must not stop a job."""
        env = os.environ if env is None else env
        url = env.get(URL_ENV, "").strip()
        if not url:
            return None
        total = _positive(env, TOTAL_STEPS_ENV, int)
        interval = _positive(env, INTERVAL_ENV, float)
        return cls(
            url=url,
            ca_file=env.get(CA_ENV) or None,
            token_file=env.get(TOKEN_ENV) or None,
            total_steps=None if total is None else int(total),
            interval=INTERVAL if interval is None else max(MIN_INTERVAL, float(interval)),
        )


def _positive(env: Mapping[str, str], name: str, kind: Callable[[str], float]) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if not positive_number(value):
        log.warning("%s=%r ignored: need a positive number", name, raw)
        return None
    return value


def status_payload(
    step: int | None,
    goodput: float | None,
    *,
    total_steps: int | None = None,
    steps_per_s: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The body of one post (Kubeflow's ``UpdateTrainJobStatusRequest``).

    ``step``: the newest complete step (None: not known yet); ``goodput``: the ratio of
    productive time, 0 to 1; with ``total_steps`` the percentage done (0 to 100) and,
    with ``steps_per_s`` as well, the seconds left. Metric values are strings, as the
    schema requires."""
    when = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    status: dict[str, Any] = {"lastUpdatedTime": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
    metrics = []
    if step is not None:
        metrics.append({"name": "step", "value": str(step)})
        if total_steps:
            done = min(step, total_steps)
            status["progressPercentage"] = done * 100 // total_steps
            if steps_per_s and steps_per_s > 0:
                status["estimatedRemainingSeconds"] = int((total_steps - done) / steps_per_s)
    if goodput is not None and math.isfinite(goodput):
        metrics.append({"name": "goodput", "value": f"{min(max(goodput, 0.0), 1.0):.4f}"})
    if metrics:
        status["metrics"] = metrics
    return {"trainerStatus": status}


def post_status(
    target: TrainerStatusTarget, payload: Mapping[str, Any], timeout: float = POST_TIMEOUT
) -> int:
    """POST ``payload`` to ``target`` now and return the HTTP status (blocking: call it
    in a worker thread). TLS is verified against ``target.ca_file``; the token file is
    read afresh. Raises ``OSError`` (``ssl.SSLError``, ``urllib.error.URLError``,
    ``TimeoutError``...) when the post does not get a 2xx answer within ``timeout``."""
    import ssl  # here: only a pod that posts pays for these imports
    import urllib.request

    context = ssl.create_default_context(cafile=target.ca_file)
    headers = {"Content-Type": "application/json"}
    if target.token_file is not None:
        with open(target.token_file, encoding="utf-8") as f:
            headers["Authorization"] = f"Bearer {f.read().strip()}"
    body = json.dumps(payload, separators=(",", ":")).encode()
    request = urllib.request.Request(target.url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        response.read(1 << 16)
        code: int = response.status
    return code


class TrainerStatusPoster:
    """Posts progress to Kubeflow Trainer every ``target.interval`` seconds;
    ``await task_group.start(poster.run)``.

    ``step()`` gives the newest complete step of the local workers (None: none yet),
    ``goodput()`` the goodput ratio (None: not known), ``posting()`` whether this node
    posts now (the node of group rank 0: exactly one node of the job posts). A post is
    made only when something changed since the last one. Cancelling :meth:`run` ends it
    at once (a post in flight is left to its thread, which ends within
    :data:`POST_TIMEOUT`). Never raises but cancellation.
    """

    def __init__(
        self,
        target: TrainerStatusTarget,
        step: Callable[[], int | None],
        goodput: Callable[[], float | None],
        posting: Callable[[], bool] = lambda: True,
        *,
        timeout: float = POST_TIMEOUT,
    ) -> None:
        self.target = target
        self._step = step
        self._goodput = goodput
        self._posting = posting
        self.timeout = timeout
        #: posts the server accepted, and posts that failed
        self.posted = 0
        self.failed = 0
        self._last: tuple[int | None, str | None] | None = None
        self._rate: tuple[float, int] | None = None  # (monotonic, step) of the first step seen

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Post until cancelled."""
        task_status.started()
        while True:
            try:
                await self.post_once()
            except Exception as exc:  # a bug here must not end the job
                log.debug("Kubeflow Trainer status: %r", exc)
            await anyio.sleep(self.target.interval)

    async def post_once(self) -> bool:
        """Post now when this node posts and something changed; return whether a post
        was accepted. Bounded by ``timeout``; never raises but cancellation."""
        if not self._posting():
            return False
        step = self._step()
        goodput = self._goodput()
        shown = f"{goodput:.4f}" if goodput is not None else None
        if (step, shown) == self._last:
            return False
        payload = status_payload(
            step, goodput, total_steps=self.target.total_steps, steps_per_s=self._speed(step)
        )
        error: BaseException | None = None
        code = 0
        with anyio.move_on_after(self.timeout + 1.0):
            try:
                code = await anyio.to_thread.run_sync(
                    post_status, self.target, payload, self.timeout, abandon_on_cancel=True
                )
            except Exception as exc:
                error = exc
        if error is None and code == 0:
            error = TimeoutError(f"no answer within {self.timeout:g} s")
        if error is not None:
            self._failed(error)
            return False
        self._last = (step, shown)
        self.posted += 1
        return True

    def _speed(self, step: int | None) -> float | None:
        now = time.monotonic()
        if step is None:
            return None
        if self._rate is None or step < self._rate[1]:  # first step, or rolled back
            self._rate = (now, step)
            return None
        since, first = self._rate
        return (step - first) / (now - since) if step > first and now > since else None

    def _failed(self, error: BaseException) -> None:
        self.failed += 1
        status = getattr(error, "code", None)  # urllib's HTTPError (not imported on the loop)
        if isinstance(status, int):
            what = f"HTTP {status} {getattr(error, 'reason', '')}"
        else:
            what = str(getattr(error, "reason", None) or error) or type(error).__name__
        if self.failed == 1:
            log.warning(
                "Kubeflow Trainer status not posted to %s: %s (the job goes on; "
                "later failures are logged at debug level)",
                self.target.url,
                what,
            )
        else:
            log.debug("Kubeflow Trainer status not posted: %s", what)
