"""The same store operations, run through torch's own ``TCPStore`` client.

Run as a script (torch is imported only here, in a subprocess):

* ``python _torch_ops.py client HOST PORT``: torch client against HOST:PORT, print results;
* ``python _torch_ops.py master``: torch's libuv server + torch client, print results;
* ``python _torch_ops.py serve``: torch's server only; print its port, exit on stdin EOF;
* ``python _torch_ops.py loop``: print ``ready`` once torch is imported, then read commands
  from stdin, one a line (``client HOST PORT``, ``master``, ``serve``: as above, each
  server kept until stdin's EOF; ``connect PORT``: a client's handshake and nothing else;
  ``blocked_get PORT``: a get of a key nobody sets, answered ``raised <exception type>``
  once it fails) and answer each with one line: one interpreter (one
  import of torch, ~2 s of CPU) serves a whole test module. An error is answered as
  ``{"error": traceback}``, which no test expects, and the loop goes on.

The test module imports :data:`OPS` and runs them through our client too.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

OPS: list[tuple[Any, ...]] = [
    ("set", "a", "1"),
    ("get", "a"),
    ("add", "c", 5),
    ("add", "c", -2),
    ("get", "c"),
    ("compare_set", "cs", "", "x"),
    ("compare_set", "cs2", "e", "x"),
    ("check", ["cs2"]),
    ("compare_set", "cs", "x", "y"),
    ("compare_set", "cs", "z", "w"),
    ("get", "cs"),
    ("check", ["a"]),
    ("check", ["a", "zz"]),
    ("delete_key", "a"),
    ("delete_key", "a"),
    ("check", ["a"]),
    ("append", "ap", "x"),
    ("append", "ap", "y"),
    ("get", "ap"),
    ("multi_set", ["m1", "m2"], ["v1", "v2"]),
    ("multi_get", ["m2", "m1"]),
    ("set", "e", ""),
    ("get", "e"),
    ("check", ["e"]),
    ("queue_push", "q", "e1"),
    ("queue_push", "q", "e2"),
    ("queue_len", "q"),
    ("check", ["q"]),
    ("queue_pop", "q", True),
    ("queue_pop", "q", False),
    ("queue_pop", "q", False),
    ("queue_len", "q"),
    ("wait", ["a"], 0.2),
    ("get_timeout", "never", 0.2),
    ("wait", ["m1"], 0.2),
    ("num_keys",),
    ("list_keys",),
]


def encode(value: Any) -> Any:
    """A result as JSON (bytes as hex): both clients' results are compared in this form."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [encode(v) for v in value]
    return value


def run_torch_ops(store: Any) -> list[Any]:
    import datetime

    import torch.distributed as dist

    results: list[Any] = []
    for op, *args in OPS:
        try:
            if op == "get_timeout":
                store.set_timeout(datetime.timedelta(seconds=args[1]))
                try:
                    value = store.get(args[0])
                finally:
                    store.set_timeout(datetime.timedelta(seconds=30))
            elif op == "wait":
                value = store.wait(args[0], datetime.timedelta(seconds=args[1]))
            elif op == "queue_pop":
                value = store.queue_pop(args[0], block=args[1])
            elif op == "list_keys":
                value = sorted(store.list_keys())
            else:
                value = getattr(store, op)(*args)
        except dist.QueueEmptyError:
            value = "<empty>"
        except dist.DistStoreError as exc:
            if "timeout" not in str(exc):
                raise
            value = "<timeout>"
        results.append(encode(value))
    return results


def loop() -> None:
    """Answer the commands on stdin until its EOF (see the module's docstring)."""
    import traceback

    import torch.distributed  # noqa: F401  (the import is what the loop saves)

    print("ready", flush=True)
    servers: list[Any] = []
    for line in sys.stdin:
        try:
            answer = one(line.split(), servers)
        except Exception:
            answer = json.dumps({"error": traceback.format_exc()})
        print(answer, flush=True)


def one(command: list[str], servers: list[Any]) -> str:
    """The answer to one command of :func:`loop`; a ``serve``'s server joins ``servers``."""
    import datetime

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    timeout = datetime.timedelta(seconds=30)
    if command[0] == "connect":  # a client's handshake with PORT, whatever answers there
        with contextlib.suppress(Exception):
            TCPStore("127.0.0.1", int(command[1]), is_master=False, timeout=timeout / 6)
        return "done"
    if command[0] == "blocked_get":  # a get of a key nobody sets, on PORT (120 s timeout)
        store = TCPStore("127.0.0.1", int(command[1]), is_master=False, timeout=timeout * 4)
        store.set("connected", "1")
        try:
            store.get("never")
        except Exception as exc:
            return f"raised {type(exc).__name__}"
        return "returned"
    if command[0] == "client":
        store = TCPStore(command[1], int(command[2]), is_master=False, timeout=timeout)
        return json.dumps(run_torch_ops(store))
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    if command[0] == "serve":
        servers.append(master)
        return f"port {master.port}"
    assert command[0] == "master", command
    store = TCPStore("127.0.0.1", master.port, is_master=False, timeout=timeout)
    return json.dumps(run_torch_ops(store))


def main(argv: list[str]) -> int:
    if argv[0] == "loop":
        loop()
        return 0
    servers: list[Any] = []
    print(one(argv, servers), flush=True)
    if servers:  # serve: until stdin's EOF
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
