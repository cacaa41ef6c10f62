"""The ``run`` flags of checkpoints (``--checkpoint-dir``, ``--checkpoint-persist-interval``,
``--checkpoint-peer-copies``, ``--job-secret-file``, ``--requeue``).

``--checkpoint-replicas`` (and ``PET_CHECKPOINT_REPLICAS``) is the old name of
``--checkpoint-peer-copies``, still read with the same meaning: "replica" now names only
torchft's replica groups (``--replica-groups``). Giving both names is an error.

Kept here so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``. The defaults and the value
checks are :class:`aelastic.checkpoint._settings.CheckpointSettings`'s (the Python API
gets the same messages); this module reads the flags and builds one settings object. It
touches no file: the directory is created and the secret file read when the job starts
(:func:`aelastic.checkpoint._disk.check_paths`, from ``open_job``), for the CLI and the
Python API alike.
"""

from __future__ import annotations

import os
from typing import Any

from .._exceptions import ConfigError
from .._option_table import Option, OptionValues
from ..checkpoint._settings import CheckpointSettings
from ._exceptions import UsageError

__all__ = ("OPTIONS", "config_fields")

_DEFAULT = CheckpointSettings()


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
        f"{_DEFAULT.persist_interval:g}",
        "seconds between two background writes to --checkpoint-dir",
    ),
    (
        ("--checkpoint-peer-copies",),
        "checkpoint_peer_copies",
        "str",
        str(_DEFAULT.peer_copies),
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
    """``{"checkpoints": CheckpointSettings}`` of these flags, their values checked (no
    file is touched: see the module's docstring).

    Raises:
        UsageError: the peer copies are given under both their new and old name
            (``--checkpoint-replicas``), or a value :class:`CheckpointSettings` refuses
            (its message).
    """
    directory = v.str_("checkpoint_dir") or None
    raw = v.str_("checkpoint_persist_interval")
    try:
        interval = float(raw)
    except (TypeError, ValueError):
        source = v.source("checkpoint_persist_interval")
        raise UsageError(f"{source} {raw!r}: expected a number of seconds") from None
    copies = _peer_copies(v)
    secret = v.str_("job_secret_file") or os.environ.get(SECRET_FILE_ENV) or None
    try:
        settings = CheckpointSettings(
            dir=directory,
            persist_interval=interval,
            peer_copies=_DEFAULT.peer_copies if copies is None else copies,
            job_secret_file=secret,
            requeue=v.flag("requeue"),
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return {"checkpoints": settings}


def _peer_copies(v: OptionValues) -> int | None:
    """``--checkpoint-peer-copies``, else its old name ``--checkpoint-replicas`` (each
    also from its ``PET_`` variable); None: neither given.

    Raises:
        UsageError: both names given, or the value is not a whole number (the old name:
            or is < 0; the new one's range is :class:`CheckpointSettings`'s).
    """
    if not v.given("checkpoint_replicas"):
        return v.int_("checkpoint_peer_copies")
    if v.given("checkpoint_peer_copies"):
        raise UsageError(
            f"{v.source('checkpoint_peer_copies')} and {v.source('checkpoint_replicas')} "
            "are the same setting (the second is its old name): give only "
            "--checkpoint-peer-copies"
        )
    return v.int_("checkpoint_replicas", minimum=0)
