"""Run a torchft job as replica groups: N independent launches and one Lighthouse.

Each group is a launch of its own (:func:`open_job`): its own rendezvous (run id
``<run_id>-rg<K>``), worker store and restart budget, its workers told torchft's
variables. A failure in one group restarts that group only; the others train on
through torchft's quorum. A group that spends its restart budget is replaced by a
spare (``--spare-replica-groups``) or excluded, and the job goes on with the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing
from contextvars import ContextVar
from typing import Any

import anyio

from .._dataclass import dataclass
from ..errors import ChildFailedError
from ..goodput import combine
from ..replicas._lighthouse import Lighthouse, check_lighthouse, open_lighthouse
from ..replicas._settings import ReplicaGroups, after_group_failure, group_env, group_run_id
from ._build import parse_signals
from ._config import LaunchConfig
from ._job import Job, open_job
from ._replica_meet import shared_lighthouse
from ._replica_view import GroupsView

__all__ = ("ReplicaGroupsResult", "group_config", "report_replica_groups", "run_replica_groups")

log = logging.getLogger("aelastic.replicas")


@dataclass(frozen=True)
class ReplicaGroupsResult:
    """How a replica-group job ended on this node.

    ``results``: each completed group's ``{global rank: return value}``;
    ``excluded``: each group that spent its restart budget (and every spare) with its
    last failure; ``replaced``: how many times a spare took a group's place;
    ``lighthouse_restarts``: how often the supervised Lighthouse was restarted.
    """

    results: dict[int, dict[int, Any]]
    excluded: dict[int, ChildFailedError]
    replaced: int = 0
    lighthouse_restarts: int = 0
    lighthouse_url: str = ""
    #: the goodput line of this node's groups (every attempt's ledger, combined as the
    #: nodes of a job are: :func:`aelastic.goodput.combine`); None: no ledger
    goodput: str | None = None


def group_config(
    config: LaunchConfig, group_id: int, groups: ReplicaGroups, lighthouse: str
) -> LaunchConfig:
    """``config`` for replica group ``group_id``: its own run id, torchft's variables;
    when this node runs several groups, a fixed ``health.port`` becomes port + id (a
    health endpoint each)."""
    extra = config.env or {}
    port = config.health.port
    if port and groups.group_id is None:
        port += group_id
    return dataclasses.replace(
        config,
        run_id=group_run_id(config.run_id, group_id),
        env={**extra, **group_env(group_id, groups.groups, lighthouse, {**os.environ, **extra})},
        health=dataclasses.replace(config.health, port=port),
    )


async def run_replica_groups(
    config: LaunchConfig,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any],
    groups: ReplicaGroups,
    *,
    handle_signals: bool = False,
) -> ReplicaGroupsResult:
    """Run this node's replica groups of a torchft job until each completed or is excluded.

    First the Lighthouse: ``groups.lighthouse`` must answer (else nothing starts), or
    one is started here (``aelastic.replicas._lighthouse.open_lighthouse``) and restarted whenever
    it exits; on many nodes (``groups.group_id`` set) the node hosting the c10d store
    at ``config.rdzv_endpoint`` starts it and the others read its URL from that store
    (:func:`shared_lighthouse`). Then every local group runs concurrently as its own launch. With
    ``handle_signals`` the ``config.signals_to_handle`` signals are trapped and sent
    to every group's workers (see :func:`run_launch`).

    Cancellation stops every group (as :func:`launch` does) and the Lighthouse.

    Raises:
        aelastic.errors.ChildFailedError: every group was excluded: the last failure of
            the lowest-numbered group.
        aelastic.replicas.LighthouseError: ``--lighthouse`` does not answer, or the
            supervised Lighthouse could not be (re)started.
        aelastic.replicas._exceptions.ReplicaGroupConfigError: torchft is not installed.
        aelastic.agent.SignalException: a handled signal stopped the job.
        Anything a single group's :func:`launch` raises other than a worker failure
        (a rendezvous error, a bad setting) stops every group and propagates.
    """
    signals = parse_signals(config.signals_to_handle) if handle_signals else []
    logging.getLogger("aelastic.agent").addFilter(_NAMES)  # once; a no-op outside groups
    results: dict[int, dict[int, Any]] = {}
    excluded: dict[int, ChildFailedError] = {}
    fatal: list[Exception] = []
    jobs: dict[int, Job] = {}
    spares = [groups.spares]
    replaced = [0]
    lighthouse: Lighthouse | None = None
    view: list[GroupsView] = []
    ledgers: list[dict[str, Any]] = []

    async def run_group(group_id: int, url: str, scope: anyio.CancelScope) -> None:
        cfg = group_config(config, group_id, groups, url)
        _GROUP.set(group_id)  # the agent's log lines of this task name the group
        while True:
            job: Job | None = None
            try:
                async with open_job(cfg, entrypoint, *args) as job:
                    jobs[group_id] = job
                    results[group_id] = await _wait_watching(group_id, job, view[0])
                    view[0].ended(group_id, job, "completed")
                    return
            except ChildFailedError as exc:
                if not after_group_failure(spares[0]):
                    if job is not None:
                        view[0].ended(group_id, job, "excluded")
                    excluded[group_id] = exc
                    log.warning(
                        "replica group %d spent its restart budget and is excluded; the "
                        "job goes on with the other groups",
                        group_id,
                    )
                    return
                spares[0] -= 1
                replaced[0] += 1
                if job is not None:
                    view[0].ended(group_id, job, "replaced")
                log.warning(
                    "replica group %d spent its restart budget; a spare takes its place", group_id
                )
            except Exception as exc:  # a signal, a rendezvous error: the whole job stops
                fatal.append(exc)
                scope.cancel()
                return
            finally:
                jobs.pop(group_id, None)
                record = None if job is None else job.goodput()
                if record is not None:
                    ledgers.append(record)

    async with AsyncExitStack() as stack:
        if groups.lighthouse is not None:
            await check_lighthouse(groups.lighthouse)
            url = groups.lighthouse
        else:
            settings = groups.settings
            if config.log_dir:
                await anyio.Path(config.log_dir).mkdir(parents=True, exist_ok=True)
                settings = dataclasses.replace(
                    settings, log_path=os.path.join(config.log_dir, "lighthouse.log")
                )
            if groups.group_id is not None:  # many nodes: the store's host runs it
                url, lighthouse = await stack.enter_async_context(
                    shared_lighthouse(config, groups.group_id, groups.groups, settings)
                )
            else:
                lighthouse = await stack.enter_async_context(open_lighthouse(settings))
                url = lighthouse.url
            if lighthouse is not None:
                log.info("torchft Lighthouse at %s (pid %s)", url, lighthouse.pid)
        if signals:
            received = stack.enter_context(anyio.open_signal_receiver(*signals))
        view.append(GroupsView(groups, config.run_id, url))
        async with anyio.create_task_group() as tg:
            tg.start_soon(view[0].run, jobs, lighthouse)
            if signals:

                async def forward() -> None:
                    async for sig in received:
                        for job in list(jobs.values()):
                            job.send_signal(sig)

                tg.start_soon(forward)
            async with anyio.create_task_group() as groups_tg:
                for group_id in groups.local_groups():
                    groups_tg.start_soon(
                        run_group,
                        group_id,
                        url,
                        groups_tg.cancel_scope,
                        name=f"replica group {group_id}",
                    )
            tg.cancel_scope.cancel()
    if fatal:
        raise fatal[0]
    if not results:
        raise excluded[min(excluded)]
    return ReplicaGroupsResult(
        results,
        excluded,
        replaced[0],
        len(lighthouse.restarts) if lighthouse is not None else 0,
        url,
        goodput_line(ledgers, sorted(groups.local_groups())),
    )


def goodput_line(records: Sequence[Mapping[str, object]], local: Sequence[int]) -> str | None:
    """The goodput of this node's replica groups ``local``: each attempt's ledger
    (``records``) combined as the nodes of one job are (the groups run side by side);
    without steps no ratio. None: no ledger."""
    ledger = combine(records)
    if ledger is None:
        return None
    names = ", ".join(map(str, local))
    return ledger.summary(f"replica group{'s' if len(local) > 1 else ''} {names} on this node")


async def _wait_watching(group_id: int, job: Job, view: GroupsView) -> dict[int, Any]:
    """``job.wait()``, while each failure of the group's workers is told (the group, the
    quorum it leaves: :meth:`GroupsView.failed`) as the agent restarts or stops them.
    The watch ends with the job, so a failure that ended it is told before this
    returns or raises ``wait()``'s error."""
    outcome: list[dict[int, Any] | BaseException] = []

    async def watch() -> None:
        restarts = 0
        async with aclosing(job.state_changes()) as changes:
            async for change in changes:
                if change.restart_count > restarts:
                    view.failed(group_id, job, change.remaining_restarts)
                elif change.state.value == "FAILED" and change.remaining_restarts == 0:
                    view.failed(group_id, job, None)
                restarts = change.restart_count

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            outcome.append(await job.wait())
        except Exception as exc:  # raised below, outside the task group
            outcome.append(exc)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


#: The replica group a task runs (its agent's log lines name it: :class:`_NameGroup`).
_GROUP: ContextVar[int | None] = ContextVar("aelastic_replica_group", default=None)


class _NameGroup(logging.Filter):
    """Prefixes ``replica group K:`` to the agent's log lines of a task that runs group
    K (``[default] worker group FAILED`` says which group among many); other lines
    pass unchanged. Installed once on the agent's logger by the runner."""

    def filter(self, record: logging.LogRecord) -> bool:
        group = _GROUP.get()
        if group is not None:
            record.msg = f"replica group {group}: {record.msg}"
        return True


_NAMES = _NameGroup()


def report_replica_groups(result: ReplicaGroupsResult, say: Callable[[str], None]) -> None:
    """Tell ``say`` (the CLI's stderr line) what did not go to plan: excluded groups
    (each with its root cause), spares used, Lighthouse restarts; then, last, the
    groups' goodput line (:func:`goodput_line`)."""
    for group_id, exc in sorted(result.excluded.items()):
        cause = exc.get_first_failure()[1]
        say(
            f"warning: replica group {group_id} was excluded after spending its restart "
            f"budget (last: rank {cause.local_rank} exit code {cause.exitcode}); the "
            f"job completed with groups {sorted(result.results)}"
        )
    if result.replaced:
        say(f"warning: spare replica groups took a failed group's place {result.replaced} time(s)")
    if result.lighthouse_restarts:
        say(f"warning: the torchft Lighthouse was restarted {result.lighthouse_restarts} time(s)")
    if result.goodput is not None:
        say(result.goodput)
