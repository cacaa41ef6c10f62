"""Bootstrap of a pre-started ("warm") worker interpreter; see ``_warm.py``.

Started as ``python <flags> _warm_boot.py <control fd>`` exactly like a worker
(own session, parent-death signal). It blocks reading the control socket; the
agent sends the worker's stdout/stderr descriptors (SCM_RIGHTS) and one message
of NUL-separated fields: ``aelastic-warm-1``, cwd, kind (``script`` or
``module``), target, the target's full argv (count, items), ``sys.argv``
(count, items), then the environment as ``NAME=value`` items. The interpreter
then becomes that worker: descriptors on 1 and 2, ``os.environ`` equal to the
target environment, cwd, ``sys.argv``/``sys.orig_argv``/``sys.path[0]`` as
``python <flags> script`` or ``python <flags> -m module`` would set them, and
runs the target as ``__main__``. Exit status, ``SystemExit`` and uncaught
exceptions behave as for a fresh interpreter. End of stream before a message
(the pool closed) exits 0 without running anything.

Deliberately imports nothing but ``os``, ``sys`` and ``_socket`` (``runpy``
only for ``-m``, as ``python -m`` does), and never aelastic: user code should
find a near-pristine interpreter.
"""

import _socket
import os
import sys

_MAGIC = b"aelastic-warm-1"
_HEADER = 8


def _receive(fd: int) -> tuple[list[int], bytes]:
    sock = _socket.socket(fileno=fd)
    try:
        fds: list[int] = []
        head = b""
        while len(head) < _HEADER:
            data, ancdata, _flags, _addr = sock.recvmsg(
                _HEADER - len(head), _socket.CMSG_SPACE(4 * 4)
            )
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
    finally:
        sock.close()


def _take(fields: list[bytes]) -> list[str]:
    count = int(fields.pop(0))
    items = [os.fsdecode(f) for f in fields[:count]]
    del fields[:count]
    return items


def _fresh_main() -> object:
    main = type(sys)("__main__")
    vars(main).update(__annotations__={}, __builtins__=sys.modules["builtins"])
    sys.modules["__main__"] = main
    return main


def _become_worker() -> tuple[str, str]:
    fds, message = _receive(int(sys.argv[1]))
    fields = message.split(b"\0")
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
    orig_argv = _take(fields)
    argv = _take(fields)
    os.chdir(cwd)
    environ = os.environb
    environ.clear()
    for item in fields:
        name, _, value = item.partition(b"=")
        environ[name] = value
    sys.orig_argv[:] = orig_argv
    sys.argv[:] = argv
    _register_stacks_dump()
    if kind == "module":
        sys.path[0] = os.getcwd()
    else:
        sys.path[0] = os.path.dirname(os.path.realpath(target))
    return kind, target


def _register_stacks_dump() -> None:
    """Hang detection (aelastic.agent._stacks): dump every thread's stack on the agent's signal."""
    path = os.environ.get("AELASTIC_STACKS_FILE")
    signum = os.environ.get("AELASTIC_STACKS_SIGNAL")
    if not path or not signum:
        return
    try:
        import faulthandler  # built in; faulthandler keeps the file open

        stream = open(path, "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(int(signum), file=stream, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        pass


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
    kind, target = _become_worker()
    if kind == "module":
        _run_module(target)
    else:
        _run_script(target)


if __name__ == "__main__":
    _main()
