"""What the job-handle tests share: a one-node c10d config on loopback, a liveness check."""

from __future__ import annotations

import os
from typing import Any

from aelastic import LaunchConfig


def job_config(nproc: int = 2, **kw: Any) -> LaunchConfig:
    """One node of ``nproc`` workers, c10d rendezvous on a free loopback port, no restart."""
    settings: dict[str, Any] = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": nproc,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,
    }
    return LaunchConfig(**{**settings, **kw})


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
