"""The environment of a worker process: torchrun's contract, as one pure function."""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence

__all__ = ("substitute_local_rank", "virtual_device", "worker_env")


def worker_env(
    base_env: Mapping[str, str],
    *,
    local_rank: int,
    global_rank: int,
    role_rank: int,
    world_size: int,
    role_world_size: int,
    role: str,
    local_world_size: int,
    group_rank: int,
    group_world_size: int,
    master_addr: str,
    master_port: int,
    restart_count: int,
    max_restarts: int,
    run_id: str,
    use_agent_store: bool,
    error_file: str | None,
    extra: Mapping[str, str] | None = None,
    virtual_local_rank: bool = False,
) -> dict[str, str]:
    """Return the environment of one worker: ``base_env`` plus torchrun's variables.

    The worker inherits ``base_env`` (normally a copy of the agent's environment; it
    is never mutated), then ``extra``, then the contract (``RANK``, ``LOCAL_RANK``,
    ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_NAME``, ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``,
    ``GROUP_WORLD_SIZE``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_RUN_ID``,
    ``TORCHELASTIC_USE_AGENT_STORE``, ``TORCHELASTIC_ERROR_FILE``). Defaults applied only
    when unset: ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, and ``OMP_NUM_THREADS=1`` when
    more than one worker shares the node. ``virtual_local_rank``: ``LOCAL_RANK=0`` and
    ``CUDA_VISIBLE_DEVICES`` narrowed to this worker's device (:func:`virtual_device`).
    """
    env = dict(base_env)
    if extra:
        env.update(extra)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(global_rank),
            "GROUP_RANK": str(group_rank),
            "ROLE_RANK": str(role_rank),
            "ROLE_NAME": role,
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "WORLD_SIZE": str(world_size),
            "GROUP_WORLD_SIZE": str(group_world_size),
            "ROLE_WORLD_SIZE": str(role_world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(bool(use_agent_store)),
            "TORCHELASTIC_ERROR_FILE": error_file or "",
        }
    )
    if virtual_local_rank:
        env["CUDA_VISIBLE_DEVICES"] = virtual_device(base_env, local_rank)
        env["LOCAL_RANK"] = "0"
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def virtual_device(base_env: Mapping[str, str], local_rank: int) -> str:
    """The one device a virtual-local-rank worker sees: the local_rank-th entry of the
    agent's ``CUDA_VISIBLE_DEVICES``, or the local rank when the list is unset or short."""
    devices = [d.strip() for d in base_env.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    devices = [d for d in devices if d]
    return devices[local_rank] if local_rank < len(devices) else str(local_rank)


def substitute_local_rank(args: Sequence[str], local_rank: int) -> list[str]:
    """torch's argument macro: ``${local_rank}`` in any argument becomes the local rank."""
    macro = {"local_rank": str(local_rank)}
    return [string.Template(a).safe_substitute(macro) for a in args]
