"""Run a Python callable as a worker, in a freshly spawned interpreter, without pickle.

The callable travels **by import reference** (``module:qualname``), and the
child gets this process's ``sys.path``, as with multiprocessing's spawn. A callable
defined in the main script (``__main__``) travels as the script's path and is
re-imported under the name ``__mp_main__``, as multiprocessing's spawn does, so
the script's ``if __name__ == "__main__":`` block does not run again.

Arguments and the return value travel as **JSON**: ``None``, ``bool``,
``int``, ``float``, ``str``, ``list``/``tuple`` (a tuple arrives as a list) and
``dict`` with ``str`` keys, nested freely. Anything else (objects, tensors,
sets, bytes) raises TypeError naming the argument: pass a path or a config
dict instead and build the object inside the worker.
"""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from ._exceptions import CallableResultError

__all__ = (
    "JSON_RULE",
    "callable_process_args",
    "callable_reference",
    "check_json_value",
    "read_callable_result",
)

JSON_RULE = (
    "callable entry points run in a spawned Python process and exchange arguments and"
    " return values as JSON: None, bool, int, float, str, list/tuple and dict with str"
    " keys; build other objects inside the worker"
)

_MAIN_MODULE = "aelastic.workers._callable_main"


def check_json_value(value: Any, where: str) -> None:
    """Raise TypeError naming ``where`` if ``value`` is not plain JSON data."""
    if value is None or isinstance(value, bool | int | float | str):
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_json_value(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{where} has a key {key!r} of type {type(key).__name__}; dict keys must"
                    f" be str because {JSON_RULE}"
                )
            check_json_value(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__name__}, which is not JSON; {JSON_RULE}")


def callable_reference(fn: Callable[..., Any]) -> tuple[str, str | None]:
    """``("module:qualname", main_script_path_or_None)`` for a module-level callable.

    Raises TypeError for lambdas, nested functions, bound methods of instances
    and callables of a ``__main__`` without a file (an interactive session).
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(
            f"entry point {fn!r} has no __module__/__qualname__; pass a function defined at"
            " module level (it is re-imported by reference in the worker)"
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(
            f"entry point {module}.{qualname} is a lambda or a nested function; the worker"
            " re-imports it by name, so define it at module level"
        )
    bound_to = getattr(fn, "__self__", None)
    if bound_to is not None and not isinstance(bound_to, type | types.ModuleType):
        raise TypeError(
            f"entry point {module}.{qualname} is bound to an instance, which cannot be"
            " re-imported; use a module-level function or a staticmethod/classmethod"
        )
    main_path: str | None = None
    if module == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if not main_file:
            raise TypeError(
                f"entry point {qualname} is defined in an interactive __main__ without a file;"
                " put it in a module or script so the worker can import it"
            )
        main_path = os.path.abspath(main_file)
    return f"{module}:{qualname}", main_path


def callable_process_args(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    result_file: str,
    python: str | None = None,
) -> list[str]:
    """The argv that runs ``fn(*args)`` in a spawned interpreter and writes its result.

    The child applies :func:`aelastic.errors.record` (an exception becomes
    ``error.json`` when ``TORCHELASTIC_ERROR_FILE`` is set), runs an
    ``async def`` with ``asyncio.run``, and writes the JSON return value to
    ``result_file`` (read it with :func:`read_callable_result`). Raises
    TypeError if an argument is not JSON (see ``JSON_RULE``).
    """
    reference, main_path = callable_reference(fn)
    for i, arg in enumerate(args):
        check_json_value(arg, f"argument {i} of {reference}")
    argv = [python or sys.executable, "-u", "-m", _MAIN_MODULE, "--target", reference]
    if main_path is not None:
        argv += ["--main-path", main_path]
    argv += ["--result-file", result_file, "--args-json", json.dumps(list(args))]
    # Like multiprocessing's spawn, the child sees this process's import path.
    argv += ["--sys-path-json", json.dumps([p for p in sys.path if isinstance(p, str)])]
    return argv


def read_callable_result(path: str) -> Any:
    """The return value a callable worker wrote to ``path``.

    Raises :class:`CallableResultError` when the file is missing (the worker did
    not return: it failed, was killed, or was not started with a result file)
    or malformed.
    """
    try:
        with open(path, encoding="utf-8") as fp:
            data = json.load(fp)
    except FileNotFoundError:
        raise CallableResultError(
            f"no result file at {path}: the callable worker did not return normally"
        ) from None
    except (OSError, ValueError) as exc:
        raise CallableResultError(f"unreadable result file {path}: {exc}") from exc
    if not isinstance(data, dict) or "return_value" not in data:
        raise CallableResultError(f"result file {path} lacks 'return_value': {data!r}")
    return data["return_value"]
