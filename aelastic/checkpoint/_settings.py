"""``CheckpointSettings``: what a launch asks of :mod:`aelastic.checkpoint`, checked once.

One frozen object per launch: its defaults are stated here and nowhere else, and its
checks run when it is made, so the command line (``--checkpoint-dir``,
``--checkpoint-persist-interval``, ``--checkpoint-peer-copies``, ``--job-secret-file``,
``--requeue``: see ``aelastic.launcher._checkpoint_args``) and the Python API
(``LaunchConfig(checkpoints=CheckpointSettings(...))``) refuse a bad value with the same
message. The launcher holds it as ``LaunchConfig.checkpoints`` and the agent hands it to
:func:`aelastic.checkpoint._agent.open_checkpoints` as it is.

Only values are checked here (no file is read or created): whether the directory is
writable and the secret file readable is checked when the job starts
(:func:`aelastic.checkpoint._disk.check_paths`), and by the agent when it uses them.
No torch, no anyio.
"""

from __future__ import annotations

from .._dataclass import dataclass
from .._exceptions import ConfigError
from .._numbers import positive_number, shown

__all__ = ("CheckpointSettings",)


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
