"""``ChildFailedError``: the summary of a failed worker group, root cause last."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._exceptions import AelasticError, show_public_module
from .._net import node_name
from ._failure import NOT_AVAILABLE, ProcessFailure

__all__ = ("ChildFailedError",)

_MAX_WIDTH = 60


class ChildFailedError(AelasticError):
    """One or more workers failed; ``failures`` maps global rank to :class:`ProcessFailure`.

    The root cause is the failure that happened first (:meth:`get_first_failure`).
    ``str(error)`` is torch's banner: title, the other failures, then the root
    cause **last** so it is what a user sees at the bottom of a log, each entry
    with time, host, global and local rank, exit code, pid, signal name, error
    file and traceback (or an OOM hint for a SIGKILL without an error file).

    ``hostname`` defaults to this machine's name, as ``/status`` reports it
    (``socket.gethostname()``, read once per process).
    ``notes``: lines about the job printed in their own section above the root
    cause (the nodes excluded meanwhile, see ``aelastic.nodes``); none by default.
    """

    def __init__(
        self,
        name: str,
        failures: Mapping[int, ProcessFailure],
        *,
        hostname: str | None = None,
        notes: Sequence[str] = (),
    ) -> None:
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure; got an empty mapping")
        self.name = name
        self.failures: dict[int, ProcessFailure] = dict(failures)
        self.hostname = hostname if hostname is not None else node_name()
        self.notes = tuple(notes)
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple[int, ProcessFailure]:
        """``(global_rank, failure)`` of the earliest failure (ties: lowest rank)."""
        rank = min(self.failures, key=lambda r: (self.failures[r].sort_key(), r))
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        """The multi-line summary (torch's layout; root cause at the bottom)."""
        title = f"{self.name} FAILED"
        root_rank, _ = self.get_first_failure()
        width = len(title)
        root_fmt = ""
        others: list[str] = []
        for idx, (rank, failure) in enumerate(sorted(self.failures.items())):
            text = self._format_failure(idx, rank, failure)
            width = max(width, *(len(line) for line in text.splitlines()))
            if rank == root_rank:
                root_fmt = text
            else:
                others.append(text)
        width = min(width, _MAX_WIDTH)
        border = boarder_delim * width
        section = section_delim * width
        lines = [
            "",
            border,
            title,
            section,
            "Failures:",
            "\n".join(others) if others else "  <NO_OTHER_FAILURES>",
            *self._notes_section(section),
            section,
            "Root Cause (first observed failure):",
            root_fmt,
            border,
        ]
        return "\n".join(lines)

    def _notes_section(self, section: str) -> list[str]:
        if not self.notes:
            return []
        return [section, "Excluded nodes:", *(f"  {note}" for note in self.notes)]

    def _format_failure(self, idx: int, rank: int, failure: ProcessFailure) -> str:
        signal_name = failure.signal_name()
        signal_str = f" ({signal_name})" if signal_name != NOT_AVAILABLE else ""
        trace = failure.traceback.rstrip("\n").replace("\n", "\n  ")
        return (
            f"[{idx}]:\n"
            f"  time      : {failure.timestamp_isoformat()}\n"
            f"  host      : {self.hostname}\n"
            f"  rank      : {rank} (local_rank: {failure.local_rank})\n"
            f"  exitcode  : {failure.exitcode} (pid: {failure.pid}){signal_str}\n"
            f"  error_file: {failure.error_file}\n"
            f"  traceback : {trace}"
        )


show_public_module(__name__, globals())
