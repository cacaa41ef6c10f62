"""Callable entry points: spawned interpreter, import by reference, JSON in and out."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from aelastic.workers import ProcessSpec, open_worker_processes
from aelastic.workers._callable import callable_process_args, read_callable_result
from aelastic.workers._exceptions import CallableResultError

pytestmark = pytest.mark.anyio  # every backend

SCRIPT = os.path.join(os.path.dirname(__file__), "agent_script.py")

MODULE = textwrap.dedent(
    """
    import asyncio, os

    def add(a, b, extra):
        return {"sum": a + b, "extra": extra, "rank": os.environ.get("RANK")}

    async def async_echo(value):
        await asyncio.sleep(0)
        return [value, value]

    def fail(msg):
        raise ValueError(msg)

    def bad_return():
        return {1, 2}

    class Holder:
        @staticmethod
        def static(x):
            return x * 2
    """
)


@pytest.fixture
def cbmod(tmp_path: Path) -> Iterator[ModuleType]:
    path = tmp_path / "aelastic_cb_mod.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("aelastic_cb_mod", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["aelastic_cb_mod"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["aelastic_cb_mod"]


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


async def run_one(argv: list[str], env: dict[str, str]) -> int:
    async with open_worker_processes([ProcessSpec(0, argv, env)]) as workers:
        with anyio.fail_after(30):
            return (await workers.wait_for_exit()).exitcode


async def test_roundtrip_with_return_value(cbmod: ModuleType, tmp_path: Path) -> None:
    result = str(tmp_path / "r0.json")
    argv = callable_process_args(cbmod.add, (2, 3, {"k": [1, None]}), result_file=result)
    assert await run_one(argv, child_env(tmp_path, RANK="7")) == 0
    assert read_callable_result(result) == {"sum": 5, "extra": {"k": [1, None]}, "rank": "7"}


async def test_child_gets_the_parent_import_path(cbmod: ModuleType, tmp_path: Path) -> None:
    # No PYTHONPATH: the module is importable only through the parent's sys.path.
    result = str(tmp_path / "p.json")
    sys.path.insert(0, str(tmp_path))
    try:
        argv = callable_process_args(cbmod.add, (1, 1, None), result_file=result)
    finally:
        sys.path.remove(str(tmp_path))
    assert await run_one(argv, dict(os.environ)) == 0
    assert read_callable_result(result)["sum"] == 2


async def test_async_callable_and_staticmethod(cbmod: ModuleType, tmp_path: Path) -> None:
    r1, r2 = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    assert (
        await run_one(
            callable_process_args(cbmod.async_echo, ("x",), result_file=r1), child_env(tmp_path)
        )
        == 0
    )
    assert read_callable_result(r1) == ["x", "x"]
    assert (
        await run_one(
            callable_process_args(cbmod.Holder.static, (4,), result_file=r2), child_env(tmp_path)
        )
        == 0
    )
    assert read_callable_result(r2) == 8


async def test_failure_writes_error_file_and_no_result(cbmod: ModuleType, tmp_path: Path) -> None:
    result, error = str(tmp_path / "r.json"), str(tmp_path / "error.json")
    argv = callable_process_args(cbmod.fail, ("broken input",), result_file=result)
    env = child_env(tmp_path, TORCHELASTIC_ERROR_FILE=error)
    assert await run_one(argv, env) == 1
    data = json.loads(await anyio.Path(error).read_text())
    assert data["message"]["message"] == "ValueError: broken input"
    with pytest.raises(CallableResultError, match="did not return normally"):
        read_callable_result(result)


async def test_non_json_return_value_fails_clearly(cbmod: ModuleType, tmp_path: Path) -> None:
    error = str(tmp_path / "error.json")
    argv = callable_process_args(cbmod.bad_return, (), result_file=str(tmp_path / "r.json"))
    assert await run_one(argv, child_env(tmp_path, TORCHELASTIC_ERROR_FILE=error)) == 1
    message = json.loads(await anyio.Path(error).read_text())["message"]["message"]
    assert "the return value is a set, which is not JSON" in message


def test_arguments_must_be_json(cbmod: ModuleType) -> None:
    with pytest.raises(TypeError, match=r"argument 1 of aelastic_cb_mod:add\['k'\] is a set"):
        callable_process_args(cbmod.add, (1, {"k": {1}}, 3), result_file="r")
    with pytest.raises(TypeError, match="keys must be str"):
        callable_process_args(cbmod.add, ({1: 2}, 1, 1), result_file="r")
    with pytest.raises(TypeError, match="lambda or a nested function"):
        callable_process_args(lambda: None, (), result_file="r")


async def test_callable_from_main_script_is_reimported(tmp_path: Path) -> None:
    cfg = json.dumps({"result_file": str(tmp_path / "main.json")})
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, SCRIPT, "callable", cfg], check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout.decode()) == {"exitcode": 0, "result": {"sum": 7.0}}
