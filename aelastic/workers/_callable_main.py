"""Worker-side main of a callable entry point: ``python -m aelastic.workers._callable_main``.

Imports the target by reference, calls it with JSON arguments under
:func:`aelastic.errors.record`, and writes ``{"return_value": ...}`` to the
result file (atomically: a partial file is never seen).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import runpy
import sys
import types
from typing import Any

from ..errors import record
from ._callable import JSON_RULE, check_json_value


def _load_main(path: str) -> types.ModuleType:
    # Like multiprocessing's spawn: run the script as __mp_main__ and alias it as
    # __main__, so its `if __name__ == "__main__":` block is skipped.
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    sys.path.insert(0, os.path.dirname(path))
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    return module


def _resolve(target: str, main_path: str | None) -> Any:
    module_name, _, qualname = target.partition(":")
    if module_name == "__main__":
        if main_path is None:
            raise RuntimeError(f"target {target} lives in __main__ but no --main-path was given")
        obj: Any = _load_main(main_path)
    else:
        obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _write_result(path: str, value: Any) -> None:
    check_json_value(value, "the return value")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fp:
        json.dump({"return_value": value}, fp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="aelastic-callable-worker")
    parser.add_argument("--target", required=True)
    parser.add_argument("--main-path")
    parser.add_argument("--result-file", required=True)
    parser.add_argument("--args-json", default="[]")
    parser.add_argument("--sys-path-json", default="[]")
    ns = parser.parse_args(argv)
    parent_path = [p for p in json.loads(ns.sys_path_json) if isinstance(p, str)]
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]

    @record
    def run() -> None:
        fn = _resolve(ns.target, ns.main_path)
        args = json.loads(ns.args_json)
        result = fn(*args)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        try:
            _write_result(ns.result_file, result)
        except TypeError as exc:
            raise TypeError(f"{ns.target} returned a value that is not JSON: {exc}") from None

    run()


async def _await(awaitable: Any) -> Any:
    return await awaitable


__all__ = ("JSON_RULE", "main")

if __name__ == "__main__":
    main()
