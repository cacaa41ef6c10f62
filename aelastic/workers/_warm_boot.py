"""Bootstrap of a pre-started ("warm") worker interpreter; see ``_warm.py``.

Started as ``python <flags> _warm_boot.py <control fd>`` exactly like a worker
(own session, parent-death signal). It blocks reading the control socket; the
agent sends the worker's stdout/stderr descriptors (SCM_RIGHTS) and one message
of NUL-separated fields: ``aelastic-warm-3``, cwd, kind (``script`` or
``module``), target, the file where the worker records its imports (``--preload
auto``; empty: none), the signals the agent ignores and the signals its thread
blocks (comma-separated numbers), the target's full argv (count, items),
``sys.argv`` (count, items), then the environment as ``NAME=value`` items.
The socket stays open: when the target ends (returns, ``SystemExit``, an uncaught
exception), the worker writes ``exit <status>\n`` into it, before the interpreter's
shutdown, so the agent can bound a shutdown that never ends (``_exit_grace.py``). It is
the one descriptor a worker holds that a worker under torchrun does not (see
docs/differences.md): close-on-exec, closed in a child the script forks, and left alone
(never written, never closed) if the script closed its number and reused it.
The interpreter then becomes that worker: the signal dispositions and mask a
fresh ``python`` spawned by the agent now would start with (ignored stays
ignored, everything else default; then what CPython's start-up adds: SIGPIPE
and SIGXFSZ ignored, KeyboardInterrupt on SIGINT unless SIGINT is ignored),
descriptors on 1 and 2, ``os.environ`` equal to the target environment, cwd,
``sys.argv``/``sys.orig_argv``/``sys.path[0]`` as ``python <flags> script`` or
``python <flags> -m module`` would set them, and runs the target as
``__main__``. Exit status, ``SystemExit`` and uncaught
exceptions behave as for a fresh interpreter. End of stream before a message
(the pool closed) exits 0 without running anything.

Before the activation the agent may send a preload message (``aelastic-preload-1``,
no descriptors; :mod:`aelastic.workers._preload`): the interpreter then takes on the
workers' common environment, cwd, argv and ``sys.path[0]``, silences its stdout and
stderr, and imports the modules in a low-priority thread (``_warm_preload.py``, run
from source) until the activation, which first stops that thread (see
:meth:`Preloader.stop <aelastic.workers._warm_preload.Preloader.stop>`) and restores
``sys.path``.

Deliberately imports nothing but ``os``, ``sys``, ``_signal`` and ``_socket``
(``runpy`` only for ``-m``, as ``python -m`` does; ``threading`` and a few standard
modules when a preload or ``auto`` learning is asked for), and no aelastic module except
the standard-library-only ``aelastic._stacks_dump`` when hang detection asks for stacks:
user code should find a near-pristine interpreter.
"""

import _signal  # type: ignore[import-not-found,unused-ignore]  # no stub; signal costs enum
import _socket
import os
import sys

TYPE_CHECKING = False  # typing costs an import; mypy reads the name
if TYPE_CHECKING:
    from typing import Any

_MAGIC = b"aelastic-warm-3"
_PRELOAD_MAGIC = b"aelastic-preload-1"
_HEADER = 8
_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_warm_preload.py")


def _receive(sock: _socket.socket) -> tuple[list[int], bytes]:
    fds: list[int] = []
    head = b""
    while len(head) < _HEADER:
        data, ancdata, _flags, _addr = sock.recvmsg(_HEADER - len(head), _socket.CMSG_SPACE(4 * 4))
        for level, kind, payload in ancdata:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(
                    int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                    for i in range(0, usable, 4)
                )
        if not data:
            os._exit(0)  # the pool closed before using this interpreter
        head += data
    size = int.from_bytes(head, "big")
    chunks = []
    while size > 0:
        data = sock.recv(min(size, 1 << 20))
        if not data:
            os._exit(0)
        chunks.append(data)
        size -= len(data)
    return fds, b"".join(chunks)


def _take(fields: list[bytes]) -> list[str]:
    count = int(fields.pop(0))
    items = [os.fsdecode(f) for f in fields[:count]]
    del fields[:count]
    return items


def _numbers(field: bytes) -> set[int]:
    return {int(n) for n in field.split(b",") if n}


def _signals_like_a_fresh_spawn(ignored: set[int], blocked: set[int]) -> None:
    """Dispositions and mask as exec of a fresh interpreter by the agent would leave them."""
    python_ignores = {getattr(_signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(_signal, n)}
    for sig in _signal.valid_signals():
        if sig in (_signal.SIGKILL, _signal.SIGSTOP):
            continue
        if sig in ignored or sig in python_ignores:
            handler = _signal.SIG_IGN
        elif sig == _signal.SIGINT:
            handler = _signal.default_int_handler
        else:
            handler = _signal.SIG_DFL
        try:  # noqa: SIM105 - contextlib is one import too many here
            _signal.signal(sig, handler)
        except (OSError, ValueError):  # a signal the C library reserves
            pass
    _signal.pthread_sigmask(_signal.SIG_SETMASK, blocked)


def _fresh_main() -> object:
    main = type(sys)("__main__")
    vars(main).update(__annotations__={}, __builtins__=sys.modules["builtins"])
    sys.modules["__main__"] = main
    return main


def _set_environ(items: list[bytes]) -> None:
    environ = os.environb
    environ.clear()
    for item in items:
        name, _, value = item.partition(b"=")
        environ[name] = value


def _set_path0(kind: str, target: str) -> None:
    if kind == "module":
        sys.path[0] = os.getcwd()
    else:
        sys.path[0] = os.path.dirname(os.path.realpath(target))


class _Preload:
    """A running preload (``--preload``): what the hand-off must stop and restore."""

    def __init__(self, fields: list[bytes]) -> None:
        cwd, kind, target, learn_dir, report_dir, lowest = (os.fsdecode(f) for f in fields[:6])
        del fields[:6]
        argv, modules, exclude = _take(fields), _take(fields), _take(fields)
        # The worker's own world, as far as it is known before the hand-off: its
        # environment (without what differs per worker), cwd, argv and sys.path[0].
        preloader = _helper()["Preloader"]  # imports threading here, in the main thread
        _set_environ(fields)
        os.chdir(cwd)
        sys.argv[:] = argv
        self.path = list(sys.path)
        _set_path0(kind, target)
        self.report_fd = os.dup(2)  # failures reach the agent's stderr
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)  # what modules print at import is not the worker's output
        os.dup2(null, 2)
        os.close(null)
        self.preloader = preloader(
            modules, exclude, learn_dir, report_dir, self.report_fd, lowest == "1"
        )
        self.preloader.start()

    def stop(self) -> None:
        """Let the import in flight finish, end the thread, give sys.path back."""
        self.preloader.stop()
        sys.path[:] = self.path
        os.close(self.report_fd)


def _receive_activation(sock: _socket.socket) -> tuple[list[int], list[bytes]]:
    """Wait for the activation; start a preload if the agent sends one first."""
    preload = None
    while True:
        fds, message = _receive(sock)
        fields = message.split(b"\0")
        if preload is None and not fds and fields[0] == _PRELOAD_MAGIC:
            fields.pop(0)
            preload = _Preload(fields)
            continue
        if preload is not None:
            preload.stop()
        return fds, fields


def _become_worker() -> "tuple[str, str, _socket.socket]":
    sock = _socket.socket(fileno=int(sys.argv[1]))
    try:
        fds, fields = _receive_activation(sock)
        # Kept (never inherited by programs the worker runs) to say when the script ended.
        os.set_inheritable(sock.fileno(), False)
    except BaseException:
        sock.close()
        raise
    if len(fds) != 2 or fields.pop(0) != _MAGIC:
        os.write(2, b"aelastic warm worker: malformed activation message\n")
        os._exit(70)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    cwd = os.fsdecode(fields.pop(0))
    kind = fields.pop(0).decode()
    target = os.fsdecode(fields.pop(0))
    learn = os.fsdecode(fields.pop(0))
    ignored = _numbers(fields.pop(0))
    _signals_like_a_fresh_spawn(ignored, _numbers(fields.pop(0)))
    orig_argv = _take(fields)
    argv = _take(fields)
    os.chdir(cwd)
    _set_environ(fields)
    sys.orig_argv[:] = orig_argv
    sys.argv[:] = argv
    _register_stacks_dump()
    _set_path0(kind, target)
    if learn:
        _record_imports(learn)
    return kind, target, sock


def _exit_status(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _identity(fd: int) -> "tuple[int, int] | None":
    """(device, inode) of the open file ``fd``; None when ``fd`` is not open."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _drop(sock: _socket.socket) -> None:
    """Close the channel if its descriptor is still ours, else only forget the number: a
    script that closed it (``os.closerange``) may have reused it for its own file."""
    fd = sock.fileno()
    if fd >= 0 and _identity(fd) == _CHANNEL_ID[0]:
        sock.close()
    else:
        sock.detach()


def _tell_script_ended(sock: _socket.socket, status: int) -> None:
    """``exit <status>`` to the agent (see ``_exit_grace.py``); from this process only.

    A forked child (no exec) does not hold the socket (closed after the fork, see
    :func:`_main`); should one unwind to here, it does not speak. Nothing is sent when the
    script closed the descriptor (it may now be another file). Never raises, never blocks.
    """
    fd = sock.fileno()
    if os.getpid() == _WORKER_PID[0] and fd >= 0 and _identity(fd) == _CHANNEL_ID[0]:
        try:  # noqa: SIM105 - contextlib is one import too many here
            sock.send(b"exit %d\n" % status, _socket.MSG_DONTWAIT)
        except OSError:
            pass
    _drop(sock)


_WORKER_PID = [0]
#: (device, inode) of the channel's socket, to tell it from a file that reused its number.
_CHANNEL_ID: "list[tuple[int, int] | None]" = [None]


def _record_imports(path: str) -> None:
    """``--preload auto``: record this worker's imports for the next idle interpreters."""
    _helper()["record_imports"](path)


def _helper() -> "dict[str, Any]":
    """``_warm_preload.py`` run from source, not imported: no ``aelastic`` in sys.modules."""
    with open(_HELPER, "rb") as f:
        code = compile(f.read(), _HELPER, "exec", dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "aelastic.workers._warm_preload"}
    exec(code, namespace)
    return namespace


def _register_stacks_dump() -> None:
    """Hang detection (aelastic.agent._stacks): dump every thread's stack on the agent's signal.

    Imports ``aelastic._stacks_dump`` (standard library only; not aelastic.progress,
    which would mark the worker as reporting) only when the agent asked for stacks.
    """
    if "AELASTIC_STACKS_FILE" not in os.environ:  # aelastic._stacks_dump.STACKS_FILE_ENV
        return
    try:
        from aelastic._stacks_dump import register_from_env
    except ImportError:  # aelastic not importable here (e.g. python -S): py-spy then
        return
    register_from_env()


def _exit_like_python(exc: BaseException) -> None:
    """Report an uncaught exception the way the interpreter's top level does."""
    tb = exc.__traceback__
    tb = None if tb is None else tb.tb_next  # drop this bootstrap's frame
    # The interpreter prints the exception's own __traceback__: trim it there.
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    if isinstance(exc, KeyboardInterrupt):
        # ``python script.py`` dies by SIGINT after an unhandled KeyboardInterrupt.
        import atexit
        import signal

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(1)


def _run_script(path: str) -> None:
    main = _fresh_main()
    # Like the interpreter: joined to the cwd, not normalised ("work/../x.py" stays).
    filename = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", filename)
    vars(main).update(__file__=filename, __cached__=None, __loader__=loader)
    try:
        with open(filename, "rb") as f:
            source = f.read()
        code = compile(source, filename, "exec", dont_inherit=True)
        del source
        exec(code, vars(main))
    except SystemExit:
        raise
    except BaseException as exc:
        _exit_like_python(exc)


def _run_module(name: str) -> None:
    _fresh_main()
    import runpy

    try:
        runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]
    except SystemExit:
        raise
    except BaseException as exc:
        _exit_like_python(exc)


def _main() -> None:
    kind, target, sock = _become_worker()
    _WORKER_PID[0] = os.getpid()
    _CHANNEL_ID[0] = _identity(sock.fileno())
    # A child the script forks (multiprocessing's fork, os.fork) does not hold the channel.
    os.register_at_fork(after_in_child=lambda: _drop(sock))
    status = 0
    try:
        if kind == "module":
            _run_module(target)
        else:
            _run_script(target)
    except SystemExit as exc:
        status = _exit_status(exc.code)
        raise
    finally:
        _tell_script_ended(sock, status)


if __name__ == "__main__":
    _main()
