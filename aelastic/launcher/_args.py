"""Parse ``aelastic run`` arguments: argv + environment -> :class:`RunArgs`. No side effects.

Every torchrun 2.13 flag is accepted with torchrun's default, its underscore alias and
its ``PET_<DEST>`` environment default (a value on the command line wins; boolean
flags read ``PET_X=0|1``), so Kubeflow's elastic policy, which drives torchrun only
through ``PET_*`` variables, drives ``aelastic run`` unchanged. Nothing here touches a
process, a file or ``os.environ``: the caller passes the environment in and applies
what :class:`RunArgs` asks for (``OMP_NUM_THREADS``, warnings).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .._dataclass import dataclass
from .._exceptions import ConfigError
from .._ids import random_uuid4
from .._option_table import Option
from ..checkpoint import _settings as _checkpoint_flags
from ..health import _settings as _health_flags
from ..nodes import _settings as _bad_node_flags
from ..progress import _settings as _hang_flags
from ..replicas import _settings as _replica_flags
from ..stragglers import _settings as _straggler_flags
from ..workers import _settings as _preload_flags
from . import _node_args, _restart_args
from ._config import DEFAULT_SIGNALS, LaunchConfig
from ._exceptions import UsageError as UsageError

if TYPE_CHECKING:
    from ..replicas._settings import ReplicaGroups
    from ..schedulers._slurm import SlurmDefaults

__all__ = (
    "PROG",
    "RunArgs",
    "UsageError",
    "build_parser",
    "count_gpus",
    "parse_run_args",
)

PROG = "python -m aelastic run"
_EXIT_BARRIER_ENV = "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT"
_STANDALONE_ENDPOINT = "localhost:0"


@dataclass(frozen=True)
class RunArgs:
    """The parsed command line.

    ``entrypoint`` and ``args`` are the worker command (``args`` still holds literal
    ``${local_rank}`` macros; the agent substitutes them per worker). ``set_env`` lists
    environment variables the CLI should set in its own process before launching
    (torchrun's ``OMP_NUM_THREADS=1`` rule), ``warnings`` what it should print once.
    """

    config: LaunchConfig
    entrypoint: str
    args: list[str]
    set_env: dict[str, str]
    warnings: tuple[str, ...]
    script: str = ""
    #: "python" (a script file), "module" (-m) or "binary" (--no-python)
    script_kind: str = "python"
    #: ``--replica-groups``: run the job as torchft replica groups (None: one job)
    replica_groups: ReplicaGroups | None = None
    #: lines to print once at start that are not warnings (the Slurm settings chosen)
    notes: tuple[str, ...] = ()

    def missing_script(self) -> str | None:
        """A one-line problem if the script or binary does not exist here, else None.

        Reads the filesystem (the rest of parsing does not); modules are not checked.
        """
        import shutil

        if self.script_kind == "python" and not os.path.isfile(self.script):
            return (
                f"training script {self.script!r} not found (cwd {os.getcwd()}); give the "
                "path of a Python file, or -m for a module"
            )
        if (
            self.script_kind == "binary"
            and not os.path.isfile(self.script)
            and shutil.which(self.script) is None
        ):
            return (
                f"--no-python: {self.script!r} is neither a file nor a command on PATH; "
                "give the path of an executable"
            )
        return None


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        if "training_script" in message:
            raise UsageError(
                f"no training script given; usage: {PROG} [options] SCRIPT [SCRIPT_ARGS...]"
            )
        raise UsageError(f"{message} (see '{PROG} --help')")


# (option strings, dest, kind, default); kind: "str" | "flag". Values are converted
# after the command line and PET_* are merged, so a bad PET_ value is named as such.
_OPTIONS: tuple[Option, ...] = (
    (("--nnodes",), "nnodes", "str", "1:1", "number of nodes, N or MIN:MAX"),
    (
        ("--nproc-per-node", "--nproc_per_node"),
        "nproc_per_node",
        "str",
        "1",
        "workers per node: an int, cpu, gpu or auto",
    ),
    (
        ("--rdzv-backend", "--rdzv_backend"),
        "rdzv_backend",
        "str",
        "static",
        "rendezvous backend: static, c10d, etcd, etcd-v2 or a plugin name",
    ),
    (
        ("--rdzv-endpoint", "--rdzv_endpoint"),
        "rdzv_endpoint",
        "str",
        "",
        "rendezvous endpoint, host[:port]",
    ),
    (("--rdzv-id", "--rdzv_id"), "rdzv_id", "str", "none", "run id shared by all nodes"),
    (
        ("--rdzv-conf", "--rdzv_conf"),
        "rdzv_conf",
        "str",
        "",
        "rendezvous settings, key1=value1,key2=value2",
    ),
    (
        ("--standalone",),
        "standalone",
        "flag",
        False,
        "single node: c10d rendezvous on a free local port, random run id",
    ),
    (
        ("--max-restarts", "--max_restarts"),
        "max_restarts",
        "str",
        "0",
        "worker-group restarts allowed after failures",
    ),
    (
        ("--monitor-interval", "--monitor_interval"),
        "monitor_interval",
        "str",
        "0.1",
        "seconds between worker checks (kept for compatibility; exits are noticed at once)",
    ),
    (
        ("--start-method", "--start_method"),
        "start_method",
        "str",
        "spawn",
        "spawn, fork or forkserver (function entrypoints only)",
    ),
    (
        ("--event-log-handler", "--event_log_handler"),
        "event_log_handler",
        "str",
        "null",
        "event destination: null, console or a registered handler name",
    ),
    (("--role",), "role", "str", "default", "role name of this node's workers"),
    (("-m", "--module"), "module", "flag", False, "run the script as 'python -m SCRIPT'"),
    (
        ("--no-python", "--no_python"),
        "no_python",
        "flag",
        False,
        "execute SCRIPT directly, not through python",
    ),
    (
        ("--run-path", "--run_path"),
        "run_path",
        "flag",
        False,
        "run SCRIPT with runpy.run_path semantics (takes precedence over --no-python)",
    ),
    (
        ("--log-dir", "--log_dir"),
        "log_dir",
        "str",
        None,
        "base directory of worker logs and error files (default: a new temp dir)",
    ),
    (
        ("-r", "--redirects"),
        "redirects",
        "str",
        "0",
        "redirect std streams to files: 0 none, 1 out, 2 err, 3 both, or 0:1,1:2",
    ),
    (
        ("-t", "--tee"),
        "tee",
        "str",
        "0",
        "like --redirects, and also tail the files to the console",
    ),
    (
        ("--local-ranks-filter", "--local_ranks_filter"),
        "local_ranks_filter",
        "str",
        "",
        "console shows only these local ranks, e.g. 0,1",
    ),
    (
        ("--duplicate-stdout-filters", "--duplicate_stdout_filters"),
        "duplicate_stdout_filters",
        "str",
        "",
        "copy tee'd stdout lines containing any of these (comma list; ,, is a comma)",
    ),
    (
        ("--duplicate-stderr-filters", "--duplicate_stderr_filters"),
        "duplicate_stderr_filters",
        "str",
        "",
        "copy tee'd stderr lines containing any of these (comma list; ,, is a comma)",
    ),
    (("--node-rank", "--node_rank"), "node_rank", "str", "0", "node rank (static backend)"),
    (
        ("--master-addr", "--master_addr"),
        "master_addr",
        "str",
        "127.0.0.1",
        "rank-0 address (static backend)",
    ),
    (
        ("--master-port", "--master_port"),
        "master_port",
        "str",
        None,
        "rank-0 port (static backend; default 29500)",
    ),
    (
        ("--local-addr", "--local_addr"),
        "local_addr",
        "str",
        None,
        "this node's address (default: the FQDN)",
    ),
    (
        ("--logs-specs", "--logs_specs"),
        "logs_specs",
        "str",
        None,
        "name of a LogsSpecs entry point (accepted for compatibility)",
    ),
    (
        ("--numa-binding", "--numa_binding"),
        "numa_binding",
        "str",
        None,
        "node, socket, exclusive or core-complex (accepted; no effect here)",
    ),
    (
        ("--signals-to-handle", "--signals_to_handle"),
        "signals_to_handle",
        "str",
        DEFAULT_SIGNALS,
        "signals the agent traps and forwards to its workers",
    ),
    (
        ("--shutdown-timeout", "--shutdown_timeout"),
        "shutdown_timeout",
        "str",
        None,
        "grace seconds before SIGKILL (default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)",
    ),
    (
        ("--exit-barrier-timeout", "--exit_barrier_timeout"),
        "exit_barrier_timeout",
        "str",
        None,
        f"seconds to wait for other nodes at exit (default: ${_EXIT_BARRIER_ENV}, else 300)",
    ),
    (
        ("--virtual-local-rank", "--virtual_local_rank"),
        "virtual_local_rank",
        "flag",
        False,
        "every worker gets LOCAL_RANK=0 and its own CUDA_VISIBLE_DEVICES",
    ),
    *_hang_flags.OPTIONS,  # hang detection (aelastic.progress), beside HangSettings
    *_restart_args.OPTIONS,  # how a failed group is restarted (aelastic.agent's policy)
    *_preload_flags.OPTIONS,  # what warm interpreters import before a restart
    *_checkpoint_flags.OPTIONS,  # aelastic.checkpoint's disk copy, beside CheckpointSettings
    *_bad_node_flags.OPTIONS,  # node health checks and exclusion (aelastic.nodes)
    *_node_args.OPTIONS,  # --node-rank-order, the rendezvous's placement
    *_replica_flags.OPTIONS,  # torchft replica groups (aelastic.replicas)
    *_straggler_flags.OPTIONS,  # slow nodes found while the job runs (aelastic.stragglers)
    *_health_flags.OPTIONS,  # the health and status endpoint (the job view's /status)
)

# Options without a PET_ variable (as in torchrun).
_NO_ENV = frozenset({"logs_specs", "numa_binding"})
_NUMA_MODES = ("node", "socket", "exclusive", "core-complex")
_START_METHODS = ("spawn", "fork", "forkserver")
_DEFAULTS = {dest: default for _, dest, _, default, _ in _OPTIONS}


def build_parser() -> argparse.ArgumentParser:
    """The ``run`` command's parser (values stay raw strings; see :func:`parse_run_args`)."""
    parser = _Parser(
        prog=PROG,
        description=(
            "Launch a distributed job: a drop-in for torchrun. Every option also reads "
            "PET_<OPTION> from the environment (e.g. PET_NPROC_PER_NODE); the command "
            "line wins (--logs-specs and --numa-binding have no variable)."
        ),
        epilog=(
            "exit status: 0 every worker of this node succeeded; 1 the job failed (summary "
            "on stderr, root cause last); 93 stopped by --max-no-progress-restarts (do not "
            "requeue); 94 this node failed --node-health-check and the job ended without "
            "it; 95 this node was excluded (--exclude-node-after) and the job ended "
            "without it; 2 a bad option or value, nothing started; 128+N "
            "stopped by handled signal N (workers got N first). LOGLEVEL=INFO|DEBUG shows "
            "the agent's log."
        ),
    )
    for flags, dest, kind, default, help_ in _OPTIONS:
        shown = _shown_default(kind, default, help_)
        if kind == "flag":
            parser.add_argument(*flags, dest=dest, action="store_const", const=True, help=help_)
        elif kind == "append":
            parser.add_argument(*flags, dest=dest, action="append", metavar="CMD", help=help_)
        else:
            parser.add_argument(*flags, dest=dest, metavar=dest.upper(), help=help_ + shown)
    parser.add_argument("training_script", help="the worker script (or module with -m)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    parser.set_defaults(**{dest: None for _, dest, _, _, _ in _OPTIONS})
    return parser


def _shown_default(kind: str, default: Any, help_: str) -> str:
    """The ``(default: X)`` suffix of an option's help, or "" when it would say nothing.

    Flags, empty or None defaults, and help texts that already state their default
    (computed ones such as ``--master-port``'s 29500) get no suffix, so no default is
    printed twice.
    """
    if kind == "flag" or default in (None, "") or "default" in help_:
        return ""
    return f" (default: {default})"


def _flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class _Values:
    """Merged option values: command line, else ``PET_<DEST>``, else torchrun's default."""

    def __init__(self, ns: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self._ns = ns
        self._env = environ

    def source(self, dest: str) -> str:
        """How to name this option's value in an error message."""
        if getattr(self._ns, dest) is not None:
            return _flag_name(dest)
        return f"PET_{dest.upper()}" if self._from_env(dest) is not None else _flag_name(dest)

    def given(self, dest: str) -> bool:
        return getattr(self._ns, dest) is not None or self._from_env(dest) is not None

    def env(self, name: str) -> str | None:
        return self._env.get(name)

    def _from_env(self, dest: str) -> str | None:
        if dest in _NO_ENV:
            return None
        return self._env.get(f"PET_{dest.upper()}")

    def str_(self, dest: str) -> Any:
        value = getattr(self._ns, dest)
        if value is None:
            value = self._from_env(dest)
        return _DEFAULTS[dest] if value is None else value

    def flag(self, dest: str) -> bool:
        if getattr(self._ns, dest):
            return True
        raw = self._from_env(dest)
        if raw is None or raw == "":
            return bool(_DEFAULTS[dest])
        try:
            return bool(int(raw))
        except ValueError:
            raise UsageError(
                f"PET_{dest.upper()}={raw!r}: a boolean option reads 0 or 1 from the environment"
            ) from None

    def int_(self, dest: str, *, minimum: int | None = None) -> int | None:
        raw = self.str_(dest)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(f"{self.source(dest)} {raw!r}: expected an integer") from None
        if minimum is not None and value < minimum:
            hint = " (0 means no restart)" if dest == "max_restarts" else ""
            raise UsageError(f"{self.source(dest)} {raw}: must be >= {minimum}{hint}")
        return value

    def float_(self, dest: str, *, minimum: float, strict: bool = False) -> float | None:
        raw = self.str_(dest)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{self.source(dest)} {raw!r}: expected a number of seconds") from None
        if value < minimum or (strict and value == minimum):
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            raise UsageError(f"{self.source(dest)} {raw}: must be {bound} seconds")
        return value


def parse_nnodes(value: str, source: str = "--nnodes") -> tuple[int, int]:
    """``"N"`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX); requires ``0 < MIN <= MAX``."""
    fix = "write N or MIN:MAX with 0 < MIN <= MAX, e.g. --nnodes 2:4"
    parts = value.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise UsageError(f"{source} {value!r} is not N or MIN:MAX; {fix}") from None
    if not 0 < low <= high:
        raise UsageError(f"{source} {value!r}: need 0 < MIN <= MAX; {fix}")
    return low, high


def count_gpus(environ: Mapping[str, str] | None = None) -> int:
    """The NVIDIA GPUs this process may use, without importing torch.

    Counts ``/proc/driver/nvidia/gpus/*`` and narrows to ``CUDA_VISIBLE_DEVICES``
    when that is set (an empty value hides every GPU).
    """
    env = os.environ if environ is None else environ
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        present = 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None or present == 0:
        return present
    entries = [v for v in visible.split(",") if v.strip()]
    count = 0
    for entry in entries:
        if entry.strip().startswith("-"):
            break  # CUDA stops at the first invalid index
        count += 1
    return min(count, present)


def parse_nproc(value: str, environ: Mapping[str, str], source: str) -> int:
    """An int, ``cpu`` (CPU count), ``gpu`` (GPU count, error if none) or ``auto``."""
    try:
        count = int(value)
    except ValueError:
        pass
    else:
        if count < 1:
            raise UsageError(f"{source} {value}: need at least 1 worker per node")
        return count
    cpus = os.cpu_count() or 1
    if value == "cpu":
        return cpus
    if value == "gpu":
        gpus = count_gpus(environ)
        if gpus == 0:
            raise UsageError(
                f"{source} gpu: no NVIDIA GPU is visible to this process "
                "(/proc/driver/nvidia/gpus is empty or CUDA_VISIBLE_DEVICES hides them); "
                "give a number of workers or 'cpu'"
            )
        return gpus
    if value == "auto":
        return count_gpus(environ) or cpus
    raise UsageError(
        f"{source} {value!r}: expected a positive integer, cpu, gpu or auto "
        "(e.g. --nproc-per-node 4)"
    )


def parse_rdzv_conf(value: str, source: str = "--rdzv-conf") -> dict[str, Any]:
    """``"k1=v1,k2=v2"`` -> ``{"k1": "v1", "k2": "v2"}``; values stay strings."""
    configs: dict[str, Any] = {}
    if not value:
        return configs
    for item in value.split(","):
        key, sep, val = item.partition("=")
        key, val = key.strip(), val.strip()
        if not sep or not key or not val:  # every key needs a value, as in torchrun
            raise UsageError(
                f"{source} {value!r}: item {item!r} is not key=value; "
                "write e.g. --rdzv-conf join_timeout=60,last_call_timeout=1"
            )
        configs[key] = val
    return configs


def split_filters(value: str) -> list[str]:
    """A comma list where ``,,`` stands for a literal comma (torchrun's filter syntax)."""
    if not value:
        return []
    marker = "\x00"
    return [p.replace(marker, ",") for p in value.replace(",,", marker).split(",") if p]


def parse_ranks_filter(value: str, source: str) -> set[int] | None:
    if not value:
        return None
    try:
        ranks = {int(v) for v in value.split(",")}
    except ValueError:
        raise UsageError(
            f"{source} {value!r}: expected a comma-separated list of local ranks, e.g. 0,1"
        ) from None
    if any(r < 0 for r in ranks):
        raise UsageError(f"{source} {value!r}: local ranks are >= 0")
    return ranks


def parse_signals(value: str, source: str) -> str:
    """Check a comma list of signal names; return it normalised (``SIGTERM,SIGUSR1``)."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    out = []
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        if not isinstance(getattr(signal, full, None), signal.Signals):
            raise UsageError(
                f"{source} {value!r}: {name!r} is not a signal of this platform; "
                "write names such as SIGTERM,SIGINT,SIGUSR1"
            )
        if full in ("SIGKILL", "SIGSTOP"):
            raise UsageError(f"{source}: {full} cannot be trapped; remove it from the list")
        out.append(full)
    return ",".join(out)


#: torchrun's plugin group for ``--logs-specs`` (its entry points name LogsSpecs classes).
LOGS_SPECS_GROUP = "torchrun.logs_specs"


def check_logs_specs(name: str) -> None:
    """Refuse ``--logs-specs NAME`` when no installed plugin provides ``NAME`` (torchrun
    refuses it too: nothing starts). A provided one is accepted, then ignored.

    Raises:
        UsageError: no entry point ``NAME`` in the ``torchrun.logs_specs`` group.
    """
    from .._entry_points import entry_points_of

    if not any(ep.name == name for ep in entry_points_of(LOGS_SPECS_GROUP)):
        raise UsageError(
            f"--logs-specs {name!r}: no installed package provides it (entry point group"
            f" {LOGS_SPECS_GROUP!r}); drop the flag (aelastic lays out logs with --log-dir,"
            " -r, -t, --local-ranks-filter) or install the plugin"
        )


def check_std_spec(value: str, source: str, local_world_size: int) -> str:
    """Validate a ``-r``/``-t`` value: a digit 0-3 or a map ``local_rank:digit,...``."""
    from ..workers._std import Std, to_map

    try:
        to_map(Std.from_str(value), local_world_size)
    except ValueError as exc:
        raise UsageError(f"{source} {value!r}: {exc}") from None
    return value.strip()


def _split_at_script(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(launcher argv up to and with the script, the script's own arguments)``.

    argparse matches every ``--word`` against the launcher's options, even after the
    script, so a script's ``--checkpoint`` would be taken as an abbreviation of
    ``--checkpoint-dir`` (or refused as ambiguous). The script is the first word that is
    neither an option nor an option's value; what follows is the script's, untouched.
    ``--`` leaves the rest to argparse as before.
    """
    takes_value = {f for flags, _, kind, _, _ in _OPTIONS if kind != "flag" for f in flags}
    every = [f for flags, *_ in _OPTIONS for f in flags] + ["--help", "-h"]
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv, []
        if not word.startswith("-") or word == "-":
            return argv[: i + 1], argv[i + 1 :]
        name = word.split("=", 1)[0]
        matches = [name] if name in every else [f for f in every if f.startswith(name)]
        needs_value = "=" not in word and len(matches) == 1 and matches[0] in takes_value
        i += 2 if needs_value else 1
    return argv, []


def _slurm_defaults(env: Mapping[str, str], address: str | None) -> SlurmDefaults | None:
    """The Slurm step's defaults, or None outside one (schedulers loaded only then)."""
    if not env.get("SLURM_JOB_ID"):
        return None
    from ..schedulers._slurm import slurm_defaults, slurm_job

    try:
        job = slurm_job(env)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return None if job is None else slurm_defaults(job, address)


def parse_run_args(
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
    slurm_address: str | None = None,
) -> RunArgs:
    """Turn ``aelastic run``'s argv and an environment into a :class:`RunArgs`.

    Pure: reads ``environ`` (default ``os.environ``) and ``/proc`` (for ``gpu``), never
    writes anything. ``python`` overrides the worker interpreter (default
    ``$PYTHON_EXEC``, else ``sys.executable``). Inside a Slurm step (``srun``) the
    rendezvous flags default to the step's (see ``aelastic.schedulers``);
    ``slurm_address`` is the first node's ``NodeAddr`` when the caller looked it up.

    Each group of flags is read by its own function, in the order the flags are checked
    (so the first wrong one is the one reported); a feature's flags are read beside its
    settings object (``aelastic.<feature>._settings``: ``OPTIONS`` and the function
    that reads them), the restart policy's in ``_restart_args`` and
    ``--node-rank-order`` in ``_node_args``. A settings object's
    :class:`ConfigError` becomes this parser's :class:`UsageError`, with its message.

    Raises:
        UsageError: a flag or value is wrong; the message is one line naming it and the fix.
    """
    env = os.environ if environ is None else environ
    ours, script_args = _split_at_script(list(argv))
    ns = build_parser().parse_args(ours)
    ns.training_script_args = [*ns.training_script_args, *script_args]
    v = _Values(ns, env)
    warnings: list[str] = []
    slurm = _slurm_defaults(env, slurm_address)

    program = _program(v, ns.training_script)
    min_nodes, max_nodes, nproc = _sizes(v, env, slurm)
    restarts = _restart_fields(v)
    node_rank, master_port = _node_rank_and_master_port(v)
    timeouts = _timeout_fields(v, env)
    workers = _worker_fields(v, nproc, warnings)
    rdzv_conf = parse_rdzv_conf(v.str_("rdzv_conf"), v.source("rdzv_conf"))
    rdzv = _rendezvous_fields(v, slurm, rdzv_conf, master_port, max_nodes)
    try:
        replicas = _replica_flags.replica_groups(
            v, standalone=rdzv.standalone, backend=rdzv.backend
        )
    except UsageError:
        raise
    except ConfigError as exc:  # the settings' check: the flag and the fix
        raise UsageError(str(exc)) from None
    endpoint = _static_rank(v, rdzv, rdzv_conf, node_rank, warnings)
    set_env = _worker_env(env, nproc, warnings)
    entrypoint, args = _entrypoint(program, env, python, ns.training_script_args)

    try:
        config = LaunchConfig(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            nproc_per_node=nproc,
            run_id=rdzv.run_id,
            role=v.str_("role"),
            rdzv_endpoint=endpoint,
            rdzv_backend=rdzv.backend,
            rdzv_configs=rdzv_conf,
            **restarts,
            log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
            local_addr=v.str_("local_addr"),
            event_log_handler=v.str_("event_log_handler"),
            **workers,
            **timeouts,
            log_dir=v.str_("log_dir"),
            **_hang_flags.config_fields(v),
            **_restart_args.config_fields(v),
            **_checkpoint_flags.config_fields(v),
            **_node_args.config_fields(v),
            **_bad_node_flags.config_fields(v),
            **_straggler_flags.config_fields(v),
            **_health_flags.config_fields(v, env),
            **_preload_flags.config_fields(
                v,
                python=not program.binary,
                replica_groups=replicas is not None,
                warnings=warnings,
            ),
        )
    except UsageError:
        raise
    except ConfigError as exc:  # a settings object's check: the flag and the fix
        raise UsageError(str(exc)) from None
    notes: tuple[str, ...] = ()
    if slurm is not None:
        nodes = f"{min_nodes}" if min_nodes == max_nodes else f"{min_nodes}:{max_nodes}"
        notes = (slurm.line(nodes, f"{endpoint} ({rdzv.backend})", rdzv.run_id, nproc),)
    return RunArgs(
        config,
        entrypoint,
        args,
        set_env,
        tuple(warnings),
        program.script,
        program.kind,
        replicas,
        notes,
    )


@dataclass(frozen=True)
class _Program:
    """What runs as a worker: ``script`` as a file, a module (``-m``), an executable
    (``--no-python``), or through ``runpy`` (``--run-path``)."""

    script: str
    module: bool
    no_python: bool
    run_path: bool

    @property
    def binary(self) -> bool:
        """The worker is not a Python interpreter (``--no-python`` without ``--run-path``)."""
        return self.no_python and not self.run_path

    @property
    def kind(self) -> str:
        return "binary" if self.binary else "module" if self.module else "python"


def _program(v: _Values, script: str) -> _Program:
    """``-m``, ``--no-python``, ``--run-path`` and the script (checked: not empty)."""
    module, no_python, run_path = v.flag("module"), v.flag("no_python"), v.flag("run_path")
    if module and no_python:
        raise UsageError(
            "-m/--module and --no-python exclude each other: -m runs 'python -m MODULE', "
            "--no-python runs SCRIPT as an executable; keep one"
        )
    if not script:
        raise UsageError(f"empty training script; usage: {PROG} [options] SCRIPT [ARGS...]")
    return _Program(script, module, no_python, run_path)


def _sizes(v: _Values, env: Mapping[str, str], slurm: SlurmDefaults | None) -> tuple[int, int, int]:
    """``--nnodes`` and ``--nproc-per-node`` (a Slurm step's when not given):
    ``(min_nodes, max_nodes, nproc_per_node)``."""
    nnodes = v.str_("nnodes")
    if slurm is not None and not v.given("nnodes"):
        nnodes = str(slurm.num_nodes)
    min_nodes, max_nodes = parse_nnodes(nnodes, v.source("nnodes"))
    if slurm is not None and v.str_("nproc_per_node") == "auto":
        nproc = slurm.nproc_auto
    else:
        nproc = parse_nproc(v.str_("nproc_per_node"), env, v.source("nproc_per_node"))
    return min_nodes, max_nodes, nproc


def _restart_fields(v: _Values) -> dict[str, Any]:
    """``--max-restarts`` and ``--monitor-interval``, as :class:`LaunchConfig` fields."""
    max_restarts = v.int_("max_restarts", minimum=0)
    assert max_restarts is not None
    monitor_interval = v.float_("monitor_interval", minimum=0.0, strict=True)
    assert monitor_interval is not None
    return {"max_restarts": max_restarts, "monitor_interval": monitor_interval}


def _node_rank_and_master_port(v: _Values) -> tuple[int, int | None]:
    """``--node-rank`` and ``--master-port`` (None: not given)."""
    node_rank = v.int_("node_rank", minimum=0)
    assert node_rank is not None
    master_port = v.int_("master_port", minimum=0)
    if master_port is not None and master_port > 65535:
        raise UsageError(f"{v.source('master_port')} {master_port}: a TCP port is 0-65535")
    return node_rank, master_port


def _timeout_fields(v: _Values, env: Mapping[str, str]) -> dict[str, Any]:
    """``--shutdown-timeout`` and ``--exit-barrier-timeout`` (else
    ``TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT``, else 300 s), as :class:`LaunchConfig` fields."""
    shutdown_timeout = v.float_("shutdown_timeout", minimum=0.0)
    exit_barrier_timeout = v.float_("exit_barrier_timeout", minimum=0.0)
    if exit_barrier_timeout is None:
        raw = env.get(_EXIT_BARRIER_ENV)
        if raw:
            try:
                exit_barrier_timeout = float(raw)
            except ValueError:
                exit_barrier_timeout = -1.0
            if exit_barrier_timeout < 0:
                raise UsageError(f"{_EXIT_BARRIER_ENV}={raw!r}: need a number of seconds >= 0")
        else:
            exit_barrier_timeout = 300.0
    return {"shutdown_timeout": shutdown_timeout, "exit_barrier_timeout": exit_barrier_timeout}


def _worker_fields(v: _Values, nproc: int, warnings: list[str]) -> dict[str, Any]:
    """How the workers start and where their output goes (``--start-method``,
    ``--numa-binding``, ``--logs-specs``, ``-r``, ``-t``, the duplicate filters,
    ``--virtual-local-rank``, ``--local-ranks-filter``, ``--signals-to-handle``), as
    :class:`LaunchConfig` fields; the flags accepted for torchrun's sake but without
    effect add a warning."""
    start_method = v.str_("start_method")
    if start_method not in _START_METHODS:
        raise UsageError(
            f"{v.source('start_method')} {start_method!r}: choose spawn, fork or forkserver"
        )
    numa = v.str_("numa_binding")
    if numa is not None:
        if numa not in _NUMA_MODES:
            raise UsageError(f"--numa-binding {numa!r}: choose one of {', '.join(_NUMA_MODES)}")
        warnings.append(f"--numa-binding {numa} is accepted but has no effect in aelastic")
    logs_specs = v.str_("logs_specs")
    if logs_specs is not None:
        check_logs_specs(logs_specs)
        warnings.append(
            f"--logs-specs {logs_specs} is accepted but ignored: aelastic uses its own "
            "log layout (--log-dir, -r, -t, --local-ranks-filter)"
        )
    return {
        "start_method": start_method,
        "numa_options": numa,
        "redirects": check_std_spec(v.str_("redirects"), v.source("redirects"), nproc),
        "tee": check_std_spec(v.str_("tee"), v.source("tee"), nproc),
        "duplicate_stdout_filters": split_filters(v.str_("duplicate_stdout_filters")),
        "duplicate_stderr_filters": split_filters(v.str_("duplicate_stderr_filters")),
        "virtual_local_rank": v.flag("virtual_local_rank"),
        "local_ranks_filter": parse_ranks_filter(
            v.str_("local_ranks_filter"), v.source("local_ranks_filter")
        ),
        "signals_to_handle": parse_signals(
            v.str_("signals_to_handle"), v.source("signals_to_handle")
        ),
    }


@dataclass(frozen=True)
class _Rendezvous:
    """The rendezvous the flags name: backend, endpoint, run id, and whether this node
    runs on its own (``--standalone``, or a static single node without an endpoint)."""

    backend: str
    endpoint: str
    run_id: str
    standalone: bool
    master_port: int


def _rendezvous_fields(
    v: _Values,
    slurm: SlurmDefaults | None,
    rdzv_conf: dict[str, Any],
    master_port: int | None,
    max_nodes: int,
) -> _Rendezvous:
    """``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-id`` and ``--standalone`` (a Slurm
    step's store on its node 0 when not given: ``rdzv_conf`` gets its ``is_host``); the
    master port defaults to 29500."""
    backend: str = v.str_("rdzv_backend")
    endpoint: str = v.str_("rdzv_endpoint")
    run_id: str = v.str_("rdzv_id")
    if slurm is not None and not v.flag("standalone"):
        if not v.given("rdzv_backend"):
            backend = "c10d"
        if not v.given("rdzv_id"):
            run_id = slurm.run_id
        if not endpoint and backend != "static":
            host = f"[{slurm.store_host}]" if ":" in slurm.store_host else slurm.store_host
            endpoint = f"{host}:{slurm.port if master_port is None else master_port}"
            # the store's host is the step's node 0, not whichever node finds the
            # address to be its own (on one machine, every node would)
            rdzv_conf.setdefault("is_host", "1" if slurm.is_host else "0")
    standalone = v.flag("standalone") or (
        backend == "static" and not endpoint and master_port is None and max_nodes == 1
    )
    if standalone:
        backend, endpoint, run_id = "c10d", _STANDALONE_ENDPOINT, random_uuid4()
    port = 29500 if master_port is None else master_port
    return _Rendezvous(backend, endpoint, run_id, standalone, port)


def _static_rank(
    v: _Values,
    rdzv: _Rendezvous,
    rdzv_conf: dict[str, Any],
    node_rank: int,
    warnings: list[str],
) -> str:
    """The rendezvous endpoint, once the static backend took ``--node-rank`` (into
    ``rdzv_conf``) and, without an endpoint, ``--master-addr``:``--master-port``; the other
    backends warn that ``--node-rank`` is unused."""
    if rdzv.backend == "static":
        rdzv_conf["rank"] = node_rank
        if not rdzv.endpoint:
            return f"{v.str_('master_addr')}:{rdzv.master_port}"
    elif node_rank != 0:
        warnings.append(
            f"--node-rank is only used by the static backend; ignored with {rdzv.backend}"
        )
    return rdzv.endpoint


def _worker_env(env: Mapping[str, str], nproc: int, warnings: list[str]) -> dict[str, str]:
    """What the launcher sets in the workers' environment: ``OMP_NUM_THREADS=1`` with
    more than one worker, unless the user set it (torchrun's, with its warning)."""
    set_env: dict[str, str] = {}
    if "OMP_NUM_THREADS" not in env and nproc > 1:
        set_env["OMP_NUM_THREADS"] = "1"
        warnings.append(
            "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; "
            "set OMP_NUM_THREADS yourself to tune it"
        )
    return set_env


def _entrypoint(
    program: _Program, env: Mapping[str, str], python: str | None, script_args: list[str]
) -> tuple[str, list[str]]:
    """The workers' command: ``(entrypoint, args)``."""
    args: list[str] = []
    entrypoint: str
    if program.run_path:
        # Like torchrun: runpy.run_path(script, run_name="__main__") under @record, so
        # an undecorated script's uncaught exception still lands in its error file; in
        # the launcher's interpreter (the runner is aelastic's), PYTHON_EXEC ignored.
        from ..errors import RUN_SCRIPT_MODULE

        entrypoint = python or sys.executable
        args = ["-u", "-m", RUN_SCRIPT_MODULE, program.script]
    elif program.no_python:
        entrypoint = program.script
    else:
        entrypoint = python or env.get("PYTHON_EXEC") or sys.executable
        args = ["-u", *(["-m"] if program.module else []), program.script]
    args.extend(script_args)
    return entrypoint, args
