"""Inside an idle warm interpreter: import modules ahead of the worker (``--preload``).

Worker-side half of :mod:`aelastic.workers._preload`; imported by ``_warm_boot.py``
only when the agent asked for a preload (or for learning). Standard library only.

:class:`Preloader` imports in one daemon thread at the lowest CPU priority (unless
told otherwise: the first workers' interpreters import at their own priority, their
imports are the first start's own)
(Linux nice values are per thread: ``setpriority(PRIO_PROCESS, tid, 19)`` lowers
only that thread, so the interpreter's main thread, which becomes the worker,
never needs raising back, which an unprivileged process could not do). It imports
the named modules first, then, with ``auto``, every second the new names the
job's workers recorded with :func:`record_imports`. :meth:`Preloader.stop` (at
hand-off) lets the import in flight finish (the worker would otherwise find it
half-done), tries to give that thread normal priority back for the rest of it
(works only with ``CAP_SYS_NICE``), and joins it: nothing of the preload runs once
the worker's own code does.

A module that fails to import is skipped; a named one is reported on the agent's
stderr by the first interpreter that meets the failure (an ``O_EXCL`` marker file
in the pool's report directory), so once per job. Learned names that fail are
dropped quietly: the worker tried them too (optional imports that fail are
recorded like the others).

Importing torch does not initialise CUDA, and nothing here does: an idle interpreter
holds no CUDA context and no GPU memory. A module whose import initialises CUDA
(``torch.cuda.init()``, a tensor on the device at import) is reported the same way,
once per job, and a learned one is not imported by the other idle interpreters.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading

TYPE_CHECKING = False  # run from source by _warm_boot.py: no typing import at run time
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ("Preloader", "cuda_initialized", "record_imports")

#: Seconds between two looks at the learned-module files.
LEARN_INTERVAL = 1.0
#: Never preloaded, whatever the worker imported (the launcher's own and entry modules).
ALWAYS_EXCLUDED = ("__main__", "__mp_main__", "aelastic", "_warm_boot")
_LOWEST_PRIORITY = 19


def _excluded(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def cuda_initialized() -> bool:
    """Whether torch initialised CUDA in this interpreter (never imports torch)."""
    cuda = sys.modules.get("torch.cuda")
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a half-imported torch
        return False


class Preloader:
    """Imports ``modules`` (then, with ``learn_dir``, what the workers recorded) in a thread."""

    def __init__(
        self,
        modules: Sequence[str],
        exclude: Sequence[str],
        learn_dir: str,
        report_dir: str,
        report_fd: int,
        lowest: bool = True,
    ) -> None:
        self._modules = list(modules)
        self._exclude = (*ALWAYS_EXCLUDED, *exclude)
        self._learn_dir = learn_dir
        self._report_dir = report_dir
        self._report_fd = report_fd
        self._lowest = lowest
        self._named = set(modules)
        self._queue = collections.deque(modules)
        self._offsets: dict[str, int] = {}
        self._tried: set[str] = set()
        self._job_dirs = {os.path.realpath(sys.path[0] or os.getcwd()), os.getcwd()}
        self._stopping = threading.Event()
        self._tid: int | None = None
        self._thread = threading.Thread(target=self._run, name="aelastic-preload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread (after its import in flight), then import what is left, here.

        Called by the main thread at hand-off: it imports the named modules and the
        learned ones the thread did not get to yet, at the main thread's priority,
        so a worker always starts with all of them (an early crash costs what the
        worker would have spent importing them itself).
        """
        self._stopping.set()
        if self._tid is not None:
            # Back to normal priority for the rest of the import: privileged only.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self._tid, os.getpriority(os.PRIO_PROCESS, 0))
        self._thread.join()
        self._work(in_thread=False)

    def _run(self) -> None:
        self._tid = threading.get_native_id()
        if self._lowest:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self._tid, _LOWEST_PRIORITY)
        while self._work(in_thread=True) and self._learn_dir:
            self._stopping.wait(LEARN_INTERVAL)

    def _work(self, *, in_thread: bool) -> bool:
        """Import the queued and newly learned names; False when the thread must end."""
        if self._learn_dir:
            self._queue.extend(self._learned())
        while self._queue:
            if in_thread and self._stopping.is_set():
                return False
            self._import(self._queue.popleft())
        return not (in_thread and self._stopping.is_set())

    def _import(self, name: str) -> None:
        if name in self._tried or name in sys.modules or _excluded(name, self._exclude):
            return
        self._tried.add(name)
        named = name in self._named
        if not named and self._is_job_code(name):
            return
        if not named and os.path.exists(os.path.join(self._report_dir, f"cuda:{name}")):
            return  # it initialised CUDA in another idle interpreter: not learned again
        cuda_before = cuda_initialized()
        try:
            __import__(name)
        except BaseException as exc:
            if named:
                text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else ""
                text = text or type(exc).__name__
                self._report(name, f"cannot import {name!r} ({text}); skipped")
            return
        if not cuda_before and cuda_initialized():
            self._report(
                f"cuda:{name}",
                f"importing {name!r} initialised CUDA in an idle interpreter (a CUDA context"
                f" and GPU memory held while it waits); "
                + ("keep it out of --preload" if named else f"--preload-exclude {name}"),
            )

    def _report(self, marker_name: str, text: str) -> None:
        """Write ``text`` on the agent's stderr once per job (an ``O_EXCL`` marker file)."""
        try:
            marker = os.open(
                os.path.join(self._report_dir, marker_name),
                os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                0o600,
            )
        except OSError:
            return  # another interpreter reported it (or the pool is gone)
        os.close(marker)
        line = f"aelastic: --preload: {text}\n"
        with contextlib.suppress(OSError):
            os.write(self._report_fd, line.encode(errors="replace"))

    def _learned(self) -> list[str]:
        """New complete lines of every learned-module file since the last look."""
        names: list[str] = []
        try:
            files = sorted(os.listdir(self._learn_dir))
        except OSError:
            return names
        for file in files:
            path = os.path.join(self._learn_dir, file)
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    offset = self._offsets.get(file, 0)
                    if size < offset:  # a new worker started over
                        offset = 0
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[file] = offset + len(complete)
            names += [n for n in complete.decode(errors="replace").splitlines() if n]
        return names

    def _is_job_code(self, name: str) -> bool:
        """True when the top-level package of ``name`` lives in the script's directory or cwd.

        The job's own code may read ``RANK`` or do work at import: never learned.
        """
        top = name.partition(".")[0]
        module = sys.modules.get(top)
        spec = getattr(module, "__spec__", None) if module is not None else None
        if spec is None:
            try:
                import importlib.util

                spec = importlib.util.find_spec(top)
            except BaseException:
                return True
        if spec is None:
            return True  # not importable: nothing to preload
        if spec.submodule_search_locations:  # a package: its parent directory is on sys.path
            places = [os.path.dirname(p) for p in spec.submodule_search_locations]
        elif spec.has_location and spec.origin:
            places = [os.path.dirname(spec.origin)]
        else:
            return False  # built-in or frozen
        return any(os.path.realpath(p) in self._job_dirs for p in places)


def record_imports(path: str) -> None:
    """Record in ``path`` every module this interpreter has and will import, one per line.

    The file is truncated, gets the names in ``sys.modules`` now, then one line per
    new import as it starts (an audit hook on ``import``; each line is one
    ``O_APPEND`` write, so it is in the file even if the worker dies by SIGKILL or
    ``os._exit`` an instant later). Forked children append to the same file.
    Never raises into the worker: a write that fails is dropped.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.write(fd, "".join(f"{n}\n" for n in list(sys.modules)).encode(errors="replace"))
    write, encode = os.write, str.encode

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event == "import":
            with contextlib.suppress(Exception):
                write(fd, encode(f"{args[0]}\n", errors="replace"))

    sys.addaudithook(hook)
