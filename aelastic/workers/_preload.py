"""``--preload``: the agent's half of importing modules in idle warm interpreters.

A :class:`PreloadPlan` belongs to one :class:`~aelastic.workers._warm.WarmPool`. It
learns the workers' common world from each hand-off (:meth:`PreloadPlan.observe`:
the environment without the variables that differ between workers or attempts,
argv, cwd, entry point) and turns it into the preload message that each new idle
interpreter gets right after it is spawned; the interpreter then imports the
modules in a low-priority thread (``_warm_preload.py``) while it waits. An
interpreter preloaded under another environment than a worker's is not handed
that worker (it is killed; a fresh one replaces it): torch reads variables such
as ``OMP_NUM_THREADS`` when it is imported.

``auto`` makes every worker record the modules it imports (:func:`record_imports
<aelastic.workers._warm_preload.record_imports>`) in ``<dir>/learned-<local
rank>``, which the idle interpreters read every second. Nothing here blocks: the
agent only builds and sends a message of a few kilobytes into a fresh socket.

The plan's directory (``<temp dir>/aelastic-preload-<random>``) has an owner
(:mod:`aelastic._owned_dirs`): the agent holds its lock while it lives, so the
directory of an agent that was SIGKILLed is freed by the next agent on the node
(:func:`sweep_preload_directories`); every other exit removes it (:meth:`PreloadPlan.close`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence

from .._dataclass import dataclass
from .._exceptions import ConfigError

__all__ = ("AUTO", "PreloadPlan", "parse_preload", "script_imports", "sweep_preload_directories")

#: ``--preload auto``: learn the modules from the job's workers.
AUTO = "auto"
PRELOAD_MAGIC = b"aelastic-preload-1"
#: The name of every plan's directory, ``aelastic-preload-<random>``, in the temp dir.
PRELOAD_DIR_PREFIX = "aelastic-preload-"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: Set by the agent per worker or per attempt (aelastic.agent._env.worker_env).
_PER_WORKER = frozenset(
    {
        "LOCAL_RANK",
        "RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
    }
)


def parse_preload(value: str | Iterable[str] | None, what: str = "--preload") -> tuple[str, ...]:
    """``"torch,numpy"`` or ``["torch", "auto"]`` as a tuple of names; raises ValueError.

    ``auto`` may appear among module names; empty items are dropped.
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(n.strip() for n in items if n.strip()))
    for name in names:
        if not _NAME.match(name):
            raise ConfigError(
                f"{what}: {name!r} is not a module name; give dotted module names"
                " separated by commas (for example torch,torch.optim), or auto"
            )
    return names


def script_imports(path: str) -> list[str]:
    """The modules a script imports unconditionally at its top level (``import x``,
    ``from x import y``; not relative, not inside ``if``/``try``/functions).

    Read with :mod:`ast`, nothing is run; [] for a file that cannot be read or parsed.
    The agent calls this in a worker thread: on CPython 3.11.7 an AST built there while
    another thread builds one can fail with ``SystemError: AST constructor recursion depth
    mismatch`` (cpython#106905); that is [] too (the workers' imports are learned anyway),
    and the agent's own imports build no AST (``aelastic/_features.py``).
    """
    import ast

    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, SystemError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return list(dict.fromkeys(names))


def sweep_preload_directories() -> list[str]:
    """Remove the preload directories in the temp dir whose agent died (SIGKILL, the
    OOM killer); their paths. Blocking (a listing of the temp dir, a few system calls
    per directory of ours): run it in a thread. Never raises. A live agent's directory,
    and one made before directories had an owner, stay."""
    import tempfile  # not at the top: the launcher imports parse_preload early

    from .._owned_dirs import sweep_abandoned

    try:
        root = tempfile.gettempdir()
    except OSError:  # no usable temp dir: nothing of ours can be there either
        return []
    return sweep_abandoned(root, PRELOAD_DIR_PREFIX)


def _fields(items: Sequence[str]) -> list[bytes]:
    return [str(len(items)).encode(), *(os.fsencode(i) for i in items)]


@dataclass
class _World:
    """What every worker of the job shares: the preload happens in it."""

    env: dict[str, str]
    cwd: str
    kind: str
    target: str
    argv: tuple[str, ...]


class PreloadPlan:
    """What idle interpreters import, and in which world; see the module docstring.

    ``modules`` may contain :data:`AUTO`; ``exclude`` names modules (and their
    submodules) never preloaded. Owns a directory in the temp dir (learned modules,
    failure reports), locked while it lives (see the module docstring): creating it
    costs a few system calls and raises ``OSError`` when it cannot be made (nothing is
    left then); :meth:`close` removes it.
    """

    def __init__(self, modules: Sequence[str], exclude: Sequence[str] = ()) -> None:
        self.auto = AUTO in modules
        self.modules = tuple(m for m in modules if m != AUTO)
        self.exclude = tuple(exclude)
        import tempfile  # not at the top: the launcher imports parse_preload early

        from .._owned_dirs import claim, release

        self.dir, self._lock = claim(tempfile.gettempdir(), PRELOAD_DIR_PREFIX)
        self._learn_dir = os.path.join(self.dir, "learned")
        self._report_dir = os.path.join(self.dir, "reported")
        try:
            os.mkdir(self._learn_dir)
            os.mkdir(self._report_dir)
        except BaseException:
            release(self.dir, self._lock)
            raise
        self._world: _World | None = None
        self._volatile: set[str] = set(_PER_WORKER)
        #: The world is the agent's prediction, no hand-off observed yet.
        self.predicted = False

    def close(self) -> None:
        """Remove the directory and drop its lock (blocking file I/O: call it off the
        event loop). Idempotent, never raises."""
        if self._lock >= 0:
            from .._owned_dirs import release

            lock, self._lock = self._lock, -1
            release(self.dir, lock)

    def learn_path(self, local_rank: int) -> str:
        """Where the worker of ``local_rank`` records its imports ("" without ``auto``)."""
        return os.path.join(self._learn_dir, f"learned-{local_rank}") if self.auto else ""

    def _common(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if k not in self._volatile}

    def predict(
        self, kind: str, target: str, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> None:
        """The workers' world before the first hand-off, as the agent will build it.

        Interpreters started from now on preload in it at once (the first workers
        included); :meth:`fits_prediction` decides at the hand-off whether one may be
        used. With ``auto`` the script's unconditional top-level imports
        (:func:`script_imports`) are queued like learned names (job code skipped).
        Does nothing once a hand-off was observed.
        """
        if self._world is not None and not self.predicted:
            return
        cwd = os.path.abspath(cwd)
        self._world = _World(self._common(env), cwd, kind, target, tuple(argv))
        self.predicted = True
        if self.auto and kind == "script":
            names = script_imports(os.path.join(cwd, target))
            if names:
                with open(os.path.join(self._learn_dir, "learned-script"), "w") as f:
                    f.write("".join(f"{n}\n" for n in names))

    @staticmethod
    def fits_prediction(preloaded_env: Mapping[str, str] | None, env: Mapping[str, str]) -> bool:
        """Whether an interpreter preloaded in a predicted world may become this worker.

        Strict: every variable but the per-worker ones and ``AELASTIC_*`` (which no
        preloaded module reads) must be equal; a wrong prediction costs a fresh spawn,
        never a worker that imported its modules under another environment.
        """

        def shared(e: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k not in _PER_WORKER and k[:9] != "AELASTIC_"}

        return preloaded_env is None or shared(preloaded_env) == shared(env)

    def observe(
        self, kind: str, target: str, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> None:
        """Note a hand-off: variables that differ from the last one's are per worker."""
        world = self._world
        if self.predicted:
            world, self.predicted = None, False  # a prediction teaches nothing
        if world is not None:
            for name in set(world.env) ^ set(env):
                self._volatile.add(name)
            self._volatile.update(k for k, v in world.env.items() if env.get(k, v) != v)
        self._world = _World(self._common(env), cwd, kind, target, tuple(argv))

    def fits(self, preloaded_env: Mapping[str, str] | None, env: Mapping[str, str]) -> bool:
        """Whether an interpreter preloaded under ``preloaded_env`` may become this worker."""
        if preloaded_env is None:
            return True
        return self._common(preloaded_env) == self._common(env)

    def message(self, lowest: bool = True) -> tuple[bytes, dict[str, str]] | None:
        """The preload message for a new idle interpreter and its environment (None: not yet).

        ``lowest``: import at nice 19 (False: at the interpreter's own priority, for
        the interpreters that become the first workers: their imports are the first
        start's own). Fields (NUL-separated, after the magic): cwd, kind, target,
        learn dir (empty without ``auto``), report dir, ``lowest`` (``1`` or ``0``),
        ``sys.argv`` (count, items), modules (count, items), excluded (count, items),
        then ``NAME=value`` items.
        """
        world = self._world
        if world is None or not (self.modules or self.auto):
            return None
        env = self._common(world.env)
        fields = [
            PRELOAD_MAGIC,
            os.fsencode(world.cwd),
            world.kind.encode(),
            os.fsencode(world.target),
            os.fsencode(self._learn_dir if self.auto else ""),
            os.fsencode(self._report_dir),
            b"1" if lowest else b"0",
            *_fields(world.argv),
            *_fields(self.modules),
            *_fields(self.exclude),
            *(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()),
        ]
        return b"\0".join(fields), env
