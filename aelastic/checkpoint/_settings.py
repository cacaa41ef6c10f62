"""``CheckpointSettings``: what a launch asks of :mod:`aelastic.checkpoint`, checked once,
and its ``aelastic run`` flags.

One frozen object per launch: its defaults are stated here and nowhere else, and its
checks run when it is made, so the command line (``--checkpoint-dir``,
``--checkpoint-persist-interval``, ``--checkpoint-peer-copies``, ``--job-secret-file``,
``--requeue``: :data:`OPTIONS`, read into one by :func:`config_fields`) and the Python
API (``LaunchConfig(checkpoints=CheckpointSettings(...))``) refuse a bad value with the
same message. The launcher's parser only appends :data:`OPTIONS` to its table; it holds
the object as ``LaunchConfig.checkpoints`` and the agent hands it to
:func:`aelastic.checkpoint._agent.open_checkpoints` as it is. Every flag also reads
``PET_<NAME>`` like torchrun's own.

``--checkpoint-replicas`` (and ``PET_CHECKPOINT_REPLICAS``) is the old name of
``--checkpoint-peer-copies``, still read with the same meaning: "replica" now names only
torchft's replica groups (``--replica-groups``). Giving both names is an error.

Only values are checked here (no file is read or created): whether the directory is
writable and the secret file readable is checked when the job starts
(:func:`aelastic.checkpoint._disk.check_paths`), and by the agent when it uses them.
No torch, no anyio.
"""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass
from .._exceptions import ConfigError
from .._numbers import positive_number, shown
from .._option_table import Option, OptionValues

__all__ = ("OPTIONS", "SECRET_FILE_ENV", "CheckpointSettings", "config_fields")


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and how often the agent writes the newest step to disk, and who holds copies.

    ``dir``: the directory the newest complete step is written to in the background and
    before the launch ends, and resumed from by a fresh launch (None: in memory only).
    ``persist_interval``: seconds between two background writes. ``peer_copies``: how
    many other nodes' agents hold a copy of each node's newest step (0: none).
    ``job_secret_file``: the file whose key the agents' peer connections prove they hold
    (None: a random key agreed on through the rendezvous store). ``requeue``: after a
    SIGUSR1 preemption notice, requeue the Slurm job (needs ``dir``).

    Raises:
        ConfigError: from construction, a value that cannot work (the message names the
            flag and the fix); nothing is kept.
    """

    dir: str | None = None
    persist_interval: float = 300.0
    peer_copies: int = 1
    job_secret_file: str | None = None
    requeue: bool = False

    def __post_init__(self) -> None:
        if self.dir is not None and (not isinstance(self.dir, str) or not self.dir):
            raise ConfigError(
                f"--checkpoint-dir {self.dir!r}: need a directory path (a non-empty str), "
                "or None to keep checkpoints in memory only"
            )
        interval = self.persist_interval
        if not positive_number(interval):
            raise ConfigError(
                f"--checkpoint-persist-interval {shown(interval)}: need seconds > 0 between two "
                "writes to --checkpoint-dir (default 300)"
            )
        copies = self.peer_copies
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
            raise ConfigError(
                f"--checkpoint-peer-copies {copies!r}: need a whole number >= 0 "
                "(0: no copy on other nodes)"
            )
        if self.job_secret_file is not None and (
            not isinstance(self.job_secret_file, str) or not self.job_secret_file
        ):
            raise ConfigError(
                f"--job-secret-file {self.job_secret_file!r}: need a file path (a non-empty "
                "str), or None for a key the agents agree on"
            )
        if self.requeue and self.dir is None:
            raise ConfigError(
                "--requeue needs --checkpoint-dir: a requeued job resumes from the step "
                "written there; add --checkpoint-dir DIR (a directory every node can reach)"
            )


_DEFAULT = CheckpointSettings()

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format.
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
    """``{"checkpoints": CheckpointSettings}`` of the flags of :data:`OPTIONS`, checked
    (no file is touched: see the module's docstring).

    Raises:
        ConfigError: the peer copies given under both their new and old name
            (``--checkpoint-replicas``), an interval that is not a number, or a value
            :class:`CheckpointSettings` refuses (its message; the parser shows it as a
            usage error). A count that is not a whole number: the parser's usage error.
    """
    directory = v.str_("checkpoint_dir") or None
    raw = v.str_("checkpoint_persist_interval")
    try:
        interval = float(raw)
    except (TypeError, ValueError):
        source = v.source("checkpoint_persist_interval")
        raise ConfigError(f"{source} {raw!r}: expected a number of seconds") from None
    copies = _peer_copies(v)
    secret = v.str_("job_secret_file") or v.env(SECRET_FILE_ENV) or None
    settings = CheckpointSettings(
        dir=directory,
        persist_interval=interval,
        peer_copies=_DEFAULT.peer_copies if copies is None else copies,
        job_secret_file=secret,
        requeue=v.flag("requeue"),
    )
    return {"checkpoints": settings}


def _peer_copies(v: OptionValues) -> int | None:
    """``--checkpoint-peer-copies``, else its old name ``--checkpoint-replicas`` (each
    also from its ``PET_`` variable); None: neither given.

    Raises:
        ConfigError: both names given. A value that is not a whole number (the old
            name: or is < 0; the new one's range is :class:`CheckpointSettings`'s): the
            parser's usage error.
    """
    if not v.given("checkpoint_replicas"):
        return v.int_("checkpoint_peer_copies")
    if v.given("checkpoint_peer_copies"):
        raise ConfigError(
            f"{v.source('checkpoint_peer_copies')} and {v.source('checkpoint_replicas')} "
            "are the same setting (the second is its old name): give only "
            "--checkpoint-peer-copies"
        )
    return v.int_("checkpoint_replicas", minimum=0)
