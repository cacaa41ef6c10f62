"""Where each worker's output and error file go: the per-run log directory layout.

Layout (torchrun's; one run directory per agent, one per attempt, never deleted)::

    <log_dir>/<run_id>_<random>/attempt_<restart_count>/<local_rank>/{stdout.log,stderr.log,error.json}
    <log_dir>/<run_id>_<random>/attempt_<restart_count>/filtered_{stdout,stderr}.log

Each agent makes its own run directory (:func:`make_run_log_dir`, a
``tempfile.mkdtemp`` with the run id as prefix), so nodes sharing ``log_dir``
never race for one, and the attempt number is the restart count
(``TORCHELASTIC_RESTART_COUNT``). ``log_dir=None`` puts the run directory in a
fresh ``tempfile.mkdtemp(prefix="aelastic_")``; ``log_dir=os.devnull`` disables
files and, like torchrun, with them redirects, tee and the local-ranks filter:
every worker writes straight to the console, unprefixed, and error files are off.
A start that keeps the restart count (a membership change) gets
``attempt_<n>_<k>``: where torchrun deletes the earlier start's logs, they are kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence, Set
from dataclasses import field
from string import Template

from .._dataclass import dataclass
from .._exceptions import ConfigError
from ._exceptions import WorkerStartError
from ._spec import ProcessSpec
from ._std import Std, to_map

__all__ = (
    "DEFAULT_LOG_LINE_PREFIX_TEMPLATE",
    "LOG_LINE_PREFIX_ENV",
    "LogDestinations",
    "make_run_log_dir",
    "remove_empty_log_dirs",
    "run_dir",
)

LOG_LINE_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
#: torch's default console prefix, e.g. ``[default0]:``.
DEFAULT_LOG_LINE_PREFIX_TEMPLATE = "[${role_name}${local_rank}]:"

#: Run directories of callers that pass no ``run_dir``: one per (log_dir, run id) and process.
_run_dirs: dict[tuple[str | None, str], str] = {}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def run_dir(log_dir: str, run_id: str) -> str:
    """``<log_dir>/<run_id>``, the run id made a safe file name: what every agent of the run
    shares under ``log_dir`` (learned timeouts live there; each agent logs into its own
    ``<run_id>_<random>`` beside it, see :func:`make_run_log_dir`)."""
    return os.path.join(log_dir, _SAFE.sub("_", run_id) or "run")


def make_run_log_dir(log_dir: str | None, run_id: str) -> str | None:
    """Create this agent's run directory ``<log_dir>/<run_id>_<random>``; None for /dev/null.

    ``log_dir=None`` uses a fresh ``tempfile.mkdtemp(prefix="aelastic_")``; a missing
    ``log_dir`` is created. Raises :class:`WorkerStartError` naming the directory
    when it cannot be created (a file, no permission).
    """
    if log_dir == os.devnull:
        return None
    safe_id = _SAFE.sub("_", run_id) or "run"
    try:
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="aelastic_")
        os.makedirs(log_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=f"{safe_id}_", dir=log_dir)
    except OSError as exc:
        raise WorkerStartError(
            f"cannot create a log directory in {log_dir!r}: {exc}. Choose a writable"
            " --log-dir (a directory; it is created if missing), or /dev/null for no files."
        ) from exc


def remove_empty_log_dirs(run_dir: str) -> None:
    """Remove the directories of a temporary run directory that hold no file, then the
    run directory and its fresh ``aelastic_*`` parent if they are empty.

    For ``log_dir=None`` (:func:`make_run_log_dir`'s temporary tree): a job whose
    workers wrote nothing leaves nothing behind. Files are never removed. Bounded by
    the run's directories (attempts x local ranks); a directory that cannot be removed
    (not empty, gone) is left as it is.
    """
    for path, _dirs, _files in os.walk(run_dir, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(path)  # fails on a directory that still holds anything
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(run_dir))


def _run_dir(log_dir: str | None, run_id: str) -> str | None:
    key = (log_dir, run_id)
    path = _run_dirs.get(key)
    if path is None or not os.path.isdir(path):
        path = make_run_log_dir(log_dir, run_id)
        if path is None:
            return None
        _run_dirs[key] = path
    return path


def _fresh_attempt_dir(run_dir: str, attempt: int) -> str:
    name = f"attempt_{attempt}"
    k = 0
    while True:
        path = os.path.join(run_dir, name if k == 0 else f"{name}_{k}")
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            k += 1
        except OSError as exc:
            raise WorkerStartError(
                f"cannot create the attempt log directory {path!r}: {exc}."
                " Choose a writable --log-dir."
            ) from exc


@dataclass(frozen=True)
class LogDestinations:
    """Per-local-rank log files, error files, tee flags and console prefixes of one start.

    ``attempt_dir`` is None when files are disabled. ``filtered_stdout``/
    ``filtered_stderr`` are the attempt's shared duplicate-filter files (None
    without filters or files). :meth:`process_spec` builds a
    :class:`ProcessSpec` from them.
    """

    attempt_dir: str | None
    stdouts: dict[int, str | None] = field(default_factory=dict)
    stderrs: dict[int, str | None] = field(default_factory=dict)
    error_files: dict[int, str | None] = field(default_factory=dict)
    tee: dict[int, Std] = field(default_factory=dict)
    prefixes: dict[int, str] = field(default_factory=dict)
    show_on_console: dict[int, bool] = field(default_factory=dict)
    filtered_stdout: str | None = None
    filtered_stderr: str | None = None
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()

    @classmethod
    def for_attempt(
        cls,
        log_dir: str | None,
        run_id: str,
        attempt: int,
        local_world_size: int,
        redirects: Std | int | str | Mapping[int, Std] = Std.NONE,
        tee: Std | int | str | Mapping[int, Std] = Std.NONE,
        local_ranks_filter: Set[int] | None = None,
        prefix_template: str | None = None,
        *,
        role: str = "default",
        run_dir: str | None = None,
        global_ranks: Mapping[int, int] | None = None,
        duplicate_stdout_filters: Sequence[str] | None = None,
        duplicate_stderr_filters: Sequence[str] | None = None,
    ) -> LogDestinations:
        """Create the attempt directory and compute every rank's destinations.

        ``attempt`` is the restart count. ``run_dir`` is the agent's run
        directory from :func:`make_run_log_dir` (None: one made for this
        ``log_dir`` and ``run_id`` once per process). With ``log_dir`` set to
        ``os.devnull`` there are no files and every stream goes to the console
        as is (torchrun's rule), whatever ``redirects``, ``tee`` and
        ``local_ranks_filter`` say.

        A stream named in ``tee`` is redirected to its file *and* copied to the
        console (tee implies redirect, like torch). Console lines of tee'd
        streams carry the prefix from ``prefix_template``, else
        ``$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, else ``[${role_name}${local_rank}]:``
        (``${rank}`` is the global rank from ``global_ranks``). Ranks outside
        ``local_ranks_filter`` show nothing on the console; their files are
        unaffected. With ``duplicate_stdout_filters`` (resp. stderr), every
        console line of a tee'd stdout (stderr) containing any of the substrings
        is also appended, prefixed, to ``attempt_<n>/filtered_stdout.log``
        (``filtered_stderr.log``), one file for all local ranks, created empty
        up front (torch's ``--duplicate-std*-filters``). Raises ValueError for
        a bad rank, template or filter list.
        """
        out_filters = _filters(duplicate_stdout_filters, "duplicate_stdout_filters")
        err_filters = _filters(duplicate_stderr_filters, "duplicate_stderr_filters")
        redirect_map = to_map(redirects, local_world_size)
        tee_map = to_map(tee, local_world_size)
        if local_ranks_filter is not None:
            bad = sorted(r for r in local_ranks_filter if not 0 <= r < local_world_size)
            if bad:
                raise ConfigError(
                    f"local ranks filter names {bad}, but only local ranks"
                    f" 0..{local_world_size - 1} exist"
                )
        template = Template(
            prefix_template
            or os.environ.get(LOG_LINE_PREFIX_ENV)
            or DEFAULT_LOG_LINE_PREFIX_TEMPLATE
        )
        if log_dir == os.devnull:
            run_dir = None
        elif run_dir is None:
            run_dir = _run_dir(log_dir, run_id)
        attempt_dir = None if run_dir is None else _fresh_attempt_dir(run_dir, attempt)

        filtered: list[str | None] = []
        for needles, name in ((out_filters, "stdout"), (err_filters, "stderr")):
            path = None
            if needles and attempt_dir is not None:
                path = os.path.join(attempt_dir, f"filtered_{name}.log")
                with open(path, "ab"):
                    pass
            filtered.append(path)
        dest = cls(
            attempt_dir,
            filtered_stdout=filtered[0],
            filtered_stderr=filtered[1],
            duplicate_stdout_filters=out_filters,
            duplicate_stderr_filters=err_filters,
        )
        if attempt_dir is None:
            # Like torchrun: without files, redirects, tee and the ranks filter do not
            # apply; every worker writes straight to the console, unprefixed.
            redirect_map = tee_map = dict.fromkeys(range(local_world_size), Std.NONE)
            local_ranks_filter = None
        for rank in range(local_world_size):
            files = redirect_map[rank] | tee_map[rank]
            rank_dir = None if attempt_dir is None else os.path.join(attempt_dir, str(rank))
            if rank_dir is not None:
                os.makedirs(rank_dir, exist_ok=True)
            for flag, name, target in (
                (Std.OUT, "stdout.log", dest.stdouts),
                (Std.ERR, "stderr.log", dest.stderrs),
            ):
                if files & flag and rank_dir is not None:
                    target[rank] = os.path.join(rank_dir, name)
                else:
                    target[rank] = None
            dest.error_files[rank] = (
                None if rank_dir is None else os.path.join(rank_dir, "error.json")
            )
            dest.tee[rank] = tee_map[rank]
            try:
                prefix = template.substitute(
                    role_name=role,
                    rank=(global_ranks or {}).get(rank, rank),
                    local_rank=rank,
                )
            except (KeyError, ValueError) as exc:
                raise ConfigError(
                    f"invalid log line prefix template {template.template!r}: {exc!r};"
                    " it may use ${role_name}, ${rank} and ${local_rank}"
                ) from None
            dest.prefixes[rank] = prefix if tee_map[rank] else ""
            dest.show_on_console[rank] = local_ranks_filter is None or rank in local_ranks_filter
        return dest

    def process_spec(
        self, local_rank: int, args: list[str], env: Mapping[str, str], cwd: str | None = None
    ) -> ProcessSpec:
        """A :class:`ProcessSpec` for ``local_rank`` with these destinations, run in ``cwd``.

        ``TORCHELASTIC_ERROR_FILE`` is set in the child's environment to the
        rank's error file (empty when files are disabled), like torch.
        """
        env = dict(env)
        env["TORCHELASTIC_ERROR_FILE"] = self.error_files.get(local_rank) or ""
        return ProcessSpec(
            local_rank=local_rank,
            args=args,
            env=env,
            stdout_file=self.stdouts.get(local_rank),
            stderr_file=self.stderrs.get(local_rank),
            tee=self.tee.get(local_rank, Std.NONE),
            console_prefix=self.prefixes.get(local_rank, ""),
            show_on_console=self.show_on_console.get(local_rank, True),
            error_file=self.error_files.get(local_rank),
            cwd=cwd,
            filtered_stdout_file=self.filtered_stdout,
            filtered_stderr_file=self.filtered_stderr,
            duplicate_stdout_filters=self.duplicate_stdout_filters,
            duplicate_stderr_filters=self.duplicate_stderr_filters,
        )


def _filters(needles: Sequence[str] | None, name: str) -> tuple[str, ...]:
    if needles is None:
        return ()
    if isinstance(needles, str | bytes) or not all(isinstance(n, str) for n in needles):
        raise ValueError(
            f"{name} must be a list of substrings such as ['loss', 'error'], got {needles!r}"
        )
    return tuple(needles)
