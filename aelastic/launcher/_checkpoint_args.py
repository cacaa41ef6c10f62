"""The ``run`` flags of checkpoints (``--checkpoint-dir``, ``--checkpoint-persist-interval``,
``--checkpoint-peer-copies``, ``--job-secret-file``, ``--requeue``).

``--checkpoint-replicas`` (and ``PET_CHECKPOINT_REPLICAS``) is the old name of
``--checkpoint-peer-copies``, still read with the same meaning: "replica" now names only
torchft's replica groups (``--replica-groups``). Giving both names is an error.

Kept here so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``.
"""

from __future__ import annotations

import os
from typing import Any

from ..checkpoint import CheckpointError, _read_job_secret
from ..checkpoint._disk import check_writable
from ._exceptions import UsageError
from ._option_table import Option, OptionValues

__all__ = ("OPTIONS", "config_fields")


#: (flags, dest, kind, default, help), the launcher's option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--checkpoint-dir",),
        "checkpoint_dir",
        "str",
        None,
        "aelastic.checkpoint: write the newest complete step here in the background and "
        "before exiting; a fresh launch resumes from it",
    ),
    (
        ("--checkpoint-persist-interval",),
        "checkpoint_persist_interval",
        "str",
        "300",
        "seconds between two background writes to --checkpoint-dir",
    ),
    (
        ("--checkpoint-peer-copies",),
        "checkpoint_peer_copies",
        "str",
        "1",
        "with several nodes, copy each node's newest step to this many other nodes' agents "
        "(0: none); a node that replaces a lost one resumes from the copy",
    ),
    (
        ("--checkpoint-replicas",),
        "checkpoint_replicas",
        "str",
        None,
        "the old name of --checkpoint-peer-copies (the same meaning)",
    ),
    (
        ("--job-secret-file",),
        "job_secret_file",
        "str",
        None,
        "a file holding this job's secret, the same on every node: the agents' checkpoint "
        "peer connections prove they hold it (default: $AELASTIC_JOB_SECRET_FILE, else a "
        "random key the agents agree on through the rendezvous store)",
    ),
    (
        ("--requeue",),
        "requeue",
        "flag",
        False,
        "on SIGUSR1 (Slurm's --signal=USR1@N) with --checkpoint-dir: persist the newest "
        "step, stop, and requeue the Slurm job (scontrol requeue, from node 0)",
    ),
)

#: Where ``--job-secret-file`` is read from when neither it nor PET_JOB_SECRET_FILE is set.
SECRET_FILE_ENV = "AELASTIC_JOB_SECRET_FILE"


def config_fields(v: OptionValues) -> dict[str, Any]:
    """The ``LaunchConfig`` fields of these flags, checked (the directory is created).

    Raises:
        UsageError: the directory is not writable, the interval is not > 0 seconds, the
            peer copies are not a whole number >= 0, or both their new and old flag
            (``--checkpoint-replicas``) are given.
    """
    directory = v.str_("checkpoint_dir") or None
    if directory is not None:
        try:
            check_writable(directory)
        except CheckpointError as exc:
            raise UsageError(f"{v.source('checkpoint_dir')} {exc}") from None
    interval = v.float_("checkpoint_persist_interval", minimum=0.0, strict=True)
    copies = _peer_copies(v)
    secret = v.str_("job_secret_file") or None
    source = v.source("job_secret_file")
    if secret is None and os.environ.get(SECRET_FILE_ENV):
        secret, source = os.environ[SECRET_FILE_ENV], SECRET_FILE_ENV
    if secret is not None:
        try:
            _read_job_secret(secret)
        except ValueError as exc:
            raise UsageError(f"{source} {exc}") from None
    requeue = v.flag("requeue")
    if requeue and directory is None:
        raise UsageError(
            f"{v.source('requeue')} needs --checkpoint-dir: a requeued job resumes from the "
            "step written there; add --checkpoint-dir DIR (a directory every node can reach)"
        )
    return {
        "requeue": requeue,
        "job_secret_file": secret,
        "checkpoint_peer_copies": 1 if copies is None else copies,
        "checkpoint_dir": directory,
        "checkpoint_persist_interval": 300.0 if interval is None else interval,
    }


def _peer_copies(v: OptionValues) -> int | None:
    """``--checkpoint-peer-copies``, else its old name ``--checkpoint-replicas`` (each
    also from its ``PET_`` variable); None: neither given.

    Raises:
        UsageError: both names given, or the value is not a whole number >= 0.
    """
    if not v.given("checkpoint_replicas"):
        return v.int_("checkpoint_peer_copies", minimum=0)
    if v.given("checkpoint_peer_copies"):
        raise UsageError(
            f"{v.source('checkpoint_peer_copies')} and {v.source('checkpoint_replicas')} "
            "are the same setting (the second is its old name): give only "
            "--checkpoint-peer-copies"
        )
    return v.int_("checkpoint_replicas", minimum=0)
