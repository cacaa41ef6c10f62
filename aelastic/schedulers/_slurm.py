"""Rendezvous settings from a Slurm step's environment: no flags under ``srun``.

``srun`` (one task per node) sets everything ``aelastic run`` needs; :func:`slurm_job`
reads it and :func:`slurm_defaults` turns it into the launcher's defaults:

* run id ``slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>``: the same on every node of the step,
  and kept across a requeue (``SLURM_RESTART_COUNT`` is only reported);
* node count ``SLURM_JOB_NUM_NODES`` (``--nnodes MIN:MAX`` may narrow it, for spares);
* the c10d backend, its store on the allocation's first node (the first name of
  ``SLURM_JOB_NODELIST``, expanded like ``scontrol show hostnames``), hosted by the task
  with ``SLURM_NODEID`` 0 (``is_host``): never a guess from addresses, which on a test
  cluster are all 127.0.0.1;
* the store's address: the node's ``NodeAddr`` from Slurm's own record
  (:func:`node_address`, one bounded ``scontrol show node``), else its name for DNS;
* the port :func:`rendezvous_port`: ``PORT_BASE + (16 * job id + step id) % PORT_SPAN``,
  29600-32599 (below Linux's ephemeral ports). Jobs whose ids differ by less than 187
  never share a port; override with ``--master-port`` (keeps the Slurm host) or
  ``--rdzv-endpoint``;
* ``--nproc-per-node auto``: the GPUs Slurm granted on this node
  (``SLURM_GPUS_ON_NODE``), else its CPUs (``SLURM_CPUS_ON_NODE``).

Explicit flags and ``PET_*`` variables always win. Outside a step (no ``SLURM_JOB_ID``
or ``SLURM_STEP_ID``, e.g. in the batch script itself) nothing applies. Several tasks on
one node would start several agents there: :func:`slurm_job` refuses that.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._dataclass import dataclass
from .._exceptions import ConfigError
from ._nodelist import expand_nodelist

__all__ = (
    "PORT_BASE",
    "PORT_SPAN",
    "SlurmDefaults",
    "SlurmJob",
    "node_address",
    "rendezvous_port",
    "slurm_defaults",
    "slurm_job",
)

PORT_BASE = 29600
PORT_SPAN = 3000
#: the longest ``scontrol show node`` may take before the node's name is used instead
SCONTROL_TIMEOUT = 10.0


@dataclass(frozen=True)
class SlurmJob:
    """What a Slurm step's environment says about this node and its job."""

    job_id: int
    step_id: int
    nodes: tuple[str, ...]
    num_nodes: int
    node_id: int
    restart_count: int
    gpus_on_node: int
    cpus_on_node: int


@dataclass(frozen=True)
class SlurmDefaults:
    """The launcher's defaults under this step; explicit flags replace any of them."""

    run_id: str
    num_nodes: int
    store_host: str
    port: int
    is_host: bool
    nproc_auto: int
    restart_count: int

    def line(self, nnodes: str, endpoint: str, run_id: str, nproc: int) -> str:
        """The one line printed at start, with the values finally chosen."""
        return (
            f"slurm step: run id {run_id}, nodes {nnodes}, store {endpoint}"
            f"{', hosted here' if self.is_host else ''}, "
            f"{nproc} workers per node, restart {self.restart_count}"
        )


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"{name} is not set inside a Slurm step; run under srun")
        return default
    match = re.match(r"\d+", raw)  # SLURM_CPUS_ON_NODE and friends may carry a suffix
    if match is None:
        raise ConfigError(f"{name}={raw!r} is not a number; is this a Slurm step?")
    return int(match.group())


def _tasks_per_node(raw: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (Slurm's compressed per-node counts)."""
    counts: list[int] = []
    for part in raw.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            continue
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_job(env: Mapping[str, str]) -> SlurmJob | None:
    """This node's Slurm step, or None outside one.

    Raises:
        ConfigError: the step runs more than one task on a node (one agent per node is
            needed; it starts the workers itself), or its variables do not parse.
    """
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")):
        return None
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    counts = _tasks_per_node(per_node)
    if env.get("SLURM_NTASKS_PER_NODE", "1") not in ("", "1") or any(c > 1 for c in counts):
        raise ConfigError(
            f"srun starts {per_node or env.get('SLURM_NTASKS_PER_NODE')} tasks per node, so "
            "several aelastic agents would share a node; aelastic run starts the workers "
            "itself: use srun --ntasks-per-node=1 (and --nproc-per-node N for the workers)"
        )
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    nodes = tuple(expand_nodelist(nodelist))
    num_nodes = _int(env, "SLURM_JOB_NUM_NODES", _int(env, "SLURM_NNODES", len(nodes)))
    return SlurmJob(
        job_id=_int(env, "SLURM_JOB_ID"),
        step_id=_int(env, "SLURM_STEP_ID", _int(env, "SLURM_STEPID", 0)),
        nodes=nodes,
        num_nodes=num_nodes,
        node_id=_int(env, "SLURM_NODEID"),
        restart_count=_int(env, "SLURM_RESTART_COUNT", 0),
        gpus_on_node=_int(env, "SLURM_GPUS_ON_NODE", 0),
        cpus_on_node=_int(env, "SLURM_CPUS_ON_NODE", 1),
    )


def rendezvous_port(job_id: int, step_id: int) -> int:
    """The store port of a step: within ``PORT_BASE``..``PORT_BASE + PORT_SPAN - 1``."""
    return PORT_BASE + (16 * job_id + step_id) % PORT_SPAN


def slurm_defaults(job: SlurmJob, store_address: str | None = None) -> SlurmDefaults:
    """The launcher's defaults for ``job``; ``store_address`` is the first node's
    ``NodeAddr`` when known (else its name is used, for DNS)."""
    return SlurmDefaults(
        run_id=f"slurm-{job.job_id}.{job.step_id}",
        num_nodes=job.num_nodes,
        store_host=store_address or job.nodes[0],
        port=rendezvous_port(job.job_id, job.step_id),
        is_host=job.node_id == 0,
        nproc_auto=job.gpus_on_node or job.cpus_on_node,
        restart_count=job.restart_count,
    )


def parse_node_addr(scontrol_output: str) -> str | None:
    """``NodeAddr`` from ``scontrol show node -o NAME``; None if absent."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", scontrol_output)
    return match.group(1) if match and match.group(1) not in ("(null)", "") else None


async def node_address(
    name: str, env: Mapping[str, str], timeout: float = SCONTROL_TIMEOUT
) -> str | None:
    """The node's address as Slurm records it, or None (scontrol missing, failed or slow).

    One ``scontrol show node -o NAME`` child, killed after ``timeout`` seconds or on
    cancellation (which propagates). Never raises for scontrol's own failure: the
    caller falls back to the name.
    """
    import anyio  # here: the flag parser imports this module and stays light

    with anyio.move_on_after(timeout):
        try:
            done = await anyio.run_process(
                ["scontrol", "show", "node", "-o", name], env=dict(env), check=False
            )
        except OSError:
            return None
        if done.returncode != 0:
            return None
        return parse_node_addr(done.stdout.decode(errors="replace"))
    return None
