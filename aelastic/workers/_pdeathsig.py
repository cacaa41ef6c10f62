"""Make a worker die with its agent: ``PR_SET_PDEATHSIG=SIGKILL`` in the child (Linux).

Two ways to arm it, chosen once per process:

``wrapper`` (default when util-linux's ``setpriv`` and ``dash`` are installed):
the worker is started as ``setpriv --pdeathsig KILL -- dash -c GUARD <argv>``;
setpriv arms the signal, the shell checks that its parent is still the agent
(if the agent died before the signal was armed, the child kills itself), and
both exec into the worker, which keeps the pid. The agent's fork stays a cheap
vfork (about 0.5 ms per worker instead of about 8 ms for a ``preexec_fn``
fork). The worker's environment arrives unchanged: the guard restores or
removes ``PWD``, and an environment dash would alter (a name that is not a
shell identifier, or ``IFS``/``PPID``/``OPTIND``) uses ``preexec`` instead.

``preexec``: a ``preexec_fn`` calling ``prctl`` through ctypes, with the same
parent check. It forces a full fork of the agent, so it costs more, but
needs no external binary.

``AELASTIC_PDEATHSIG=wrapper|preexec|off`` forces a choice. The kernel sends
the signal when the *thread* that forked the child exits; workers and warm
interpreters are forked in the event-loop thread (never in a worker thread,
which anyio ends when idle), so run the agent's loop in a thread that lives as
long as the agent (normally the main thread).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence

from .._exceptions import ConfigError

__all__ = ("PDEATHSIG_ENV", "pdeathsig_mode", "pdeathsig_preexec", "wrap_argv")

PDEATHSIG_ENV = "AELASTIC_PDEATHSIG"

_PR_SET_PDEATHSIG = 1
# $PPID is the parent at shell start-up: if it is not the agent any more, the agent
# died before setpriv armed the signal, so nothing would ever kill this child.
_GUARD = '[ "$PPID" = "{pid}" ] || kill -KILL $$; '
# dash exports PWD even when it was not in the environment, or fixes its value.
_UNSET_PWD = "unset PWD; "
_RESTORE_PWD = "PWD=$1; export PWD; shift; "
# Without PATH in the environment dash searches its own default path, execvpe os.defpath;
# assigned here (not exported) the search matches and the worker still gets no PATH.
_SEARCH_DEFPATH = "PATH=$1; shift; "
# exec searches PATH itself, so argv[0] reaches the worker exactly as given ("sh", not
# "/usr/bin/sh"), as with execvpe. dash's exec takes no "--": a name starting with "-"
# goes through preexec instead.
_EXEC = 'exec "$@"'
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DASH_OWNS = frozenset({"IFS", "PPID", "OPTIND"})
_MAX_SCAN = 1 << 22  # setpriv is ~80 KB; a multi-call binary (busybox) stays bounded


@functools.lru_cache(maxsize=1)
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only the preexec mode needs it (~2 ms to import)

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    result: Callable[..., int] = prctl
    return result


@functools.lru_cache(maxsize=1)
def _wrapper_tools() -> tuple[str, str] | None:
    setpriv = shutil.which("setpriv")
    dash = shutil.which("dash")
    if setpriv is None or dash is None:
        return None
    if _mentions_pdeathsig(setpriv):
        return setpriv, dash
    try:  # a binary we cannot read, or that spells its options differently
        out = subprocess.run(
            [setpriv, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return (setpriv, dash) if "--pdeathsig" in out else None


def _mentions_pdeathsig(path: str) -> bool:
    """True when the binary at ``path`` contains ``--pdeathsig`` (its help text).

    Reading the file takes a fraction of a millisecond; running ``setpriv --help``
    costs a fork and exec (a few ms under load) before the first worker can start.
    A False here is not conclusive: the caller then asks ``--help``.
    """
    try:
        with open(path, "rb") as f:
            return b"--pdeathsig" in f.read(_MAX_SCAN)
    except OSError:
        return False


def pdeathsig_mode() -> str:
    """``"wrapper"``, ``"preexec"`` or ``"off"``: how workers get their death signal."""
    forced = os.environ.get(PDEATHSIG_ENV, "").strip().lower()
    if forced not in ("", "wrapper", "preexec", "off"):
        raise ConfigError(
            f"{PDEATHSIG_ENV}={forced!r} is not one of wrapper, preexec, off (or unset)"
        )
    if forced == "off" or not sys.platform.startswith("linux"):
        return "off"
    # The wrapper needs no ctypes here (setpriv calls prctl): check it first.
    if forced != "preexec" and _wrapper_tools() is not None:
        return "wrapper"
    if _prctl() is None:
        return "off"
    if forced == "preexec":
        return "preexec"
    if forced == "wrapper":
        raise ConfigError(
            f"{PDEATHSIG_ENV}=wrapper needs util-linux's setpriv with --pdeathsig and dash;"
            " install them or use preexec"
        )
    return "preexec"


def pdeathsig_preexec(
    sig: int = signal.SIGKILL, ignored: Collection[int] = ()
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that arms the parent-death signal, or None off Linux.

    Everything the child runs is resolved here, in the parent, so the child
    only makes system calls. If the parent already died between fork and
    prctl (the child was re-parented), the child kills itself at once.
    ``ignored``: signals the child sets to ``SIG_IGN`` before its exec (which
    keeps them ignored).
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    getppid = os.getppid
    kill = os.kill
    getpid = os.getpid
    ignore = _ignoring(ignored)

    def preexec() -> None:
        if ignore is not None:
            ignore()
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if getppid() != parent:
            kill(getpid(), signal.SIGKILL)

    return preexec


def _ignoring(ignored: Collection[int]) -> Callable[[], None] | None:
    """A ``preexec_fn`` that sets ``ignored`` to ``SIG_IGN`` in the child; None for none.

    The child of the fork is single-threaded and Python marks its thread the main one
    before a ``preexec_fn`` runs, so :func:`signal.signal` may be called there.
    """
    sigs = tuple(sorted({int(s) for s in ignored}))
    if not sigs:
        return None
    set_handler, ign = signal.signal, signal.SIG_IGN

    def ignore() -> None:
        for s in sigs:
            set_handler(s, ign)

    return ignore


def resolve_executable(argv0: str, env: Mapping[str, str], cwd: str | None) -> str | None:
    """The path ``execvpe`` would run for ``argv0`` with the child's PATH, or None."""
    if os.sep in argv0:
        path = argv0 if os.path.isabs(argv0) or cwd is None else os.path.join(cwd, argv0)
        return argv0 if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def wrap_argv(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    ignored: Collection[int] = (),
) -> tuple[list[str], Callable[[], None] | None]:
    """``(argv, preexec_fn)`` that start ``argv`` armed with PR_SET_PDEATHSIG=SIGKILL.

    The worker sees ``argv`` (``argv[0]`` included), its environment and its
    executable exactly as ``subprocess.Popen(argv, env=env)`` would give them.
    ``ignored``: signals the worker starts with ignored (``SIG_IGN`` survives exec):
    the wrapper's shell sets them (``trap ''``) before its exec, the ``preexec`` mode
    before the exec, and the ``off`` mode gets a ``preexec_fn`` for them alone. In
    the wrapper mode a signal that arrives between the exec of ``setpriv`` and the
    shell's ``trap`` (a few milliseconds) still has its default action.
    Raises FileNotFoundError when the executable does not exist (the wrapper
    would otherwise only report it as exit code 127).
    """
    mode = pdeathsig_mode()
    if mode == "off":
        return list(argv), _ignoring(ignored)
    if (
        mode == "preexec"
        or argv[0].startswith("-")
        or any(not _NAME.match(k) or k in _DASH_OWNS for k in env)
    ):
        return list(argv), pdeathsig_preexec(ignored=ignored)
    executable = resolve_executable(argv[0], env, cwd)
    if executable is None:
        path = argv[0] if cwd is None else os.path.join(cwd, argv[0])
        if os.sep in argv[0] and os.path.isfile(path):
            raise PermissionError(
                f"{argv[0]!r} is not executable: chmod +x it, or run it with an interpreter"
            )
        raise FileNotFoundError(f"no executable {argv[0]!r} (searched the worker's PATH)")
    tools = _wrapper_tools()
    assert tools is not None
    setpriv, dash = tools
    script = _GUARD.format(pid=os.getpid())
    if ignored:  # dash takes signal numbers; SIG_IGN is kept across its exec
        script += f"trap '' {' '.join(str(int(s)) for s in sorted(set(ignored)))}; "
    params: list[str] = []
    if "PWD" in env:
        script += _RESTORE_PWD
        params.append(env["PWD"])
    else:
        script += _UNSET_PWD
    if "PATH" not in env and os.sep not in argv[0]:
        script += _SEARCH_DEFPATH
        params.append(os.defpath)
    script += _EXEC
    return [setpriv, "--pdeathsig", "KILL", "--", dash, "-c", script, argv[0], *params, *argv], None
