"""Warm (pre-started) worker interpreters behave exactly like a fresh ``python -u script``.

Every check runs the same ProcessSpec twice, once spawned fresh and once handed
to a warm interpreter, and compares what the worker saw and did.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from aelastic.workers import ProcessSpec, _warm, open_worker_processes
from aelastic.workers._std import Std
from aelastic.workers._warm import (
    WarmPool,
    open_warm_pool,
    parse_python_argv,
    prestart_warm_workers,
    warm_workers_enabled,
)

PY = sys.executable

pytestmark = [
    pytest.mark.anyio,  # every backend
    pytest.mark.skipif(
        not hasattr(os, "pidfd_open"), reason="warm workers need the pidfd watcher (Linux >= 5.3)"
    ),
]


@pytest.fixture(autouse=True)
def _pidfd_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm interpreters are used only under the pidfd exit watcher (the default)."""
    monkeypatch.delenv("AELASTIC_CHILD_WATCHER", raising=False)
    monkeypatch.delenv("AELASTIC_WARM_WORKERS", raising=False)


PROBE = """\
import json, os, sys
g = globals()
out = {
    "name": __name__,
    "file": g.get("__file__"),
    "cached": g.get("__cached__"),
    "package": g.get("__package__"),
    "spec": None if __spec__ is None else [__spec__.name, __spec__.origin, __spec__.parent],
    "loader": type(g.get("__loader__")).__name__,
    "globals": sorted(g),
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "main_is_module": sys.modules["__main__"].__dict__ is g,
    "stdout_tty": sys.stdout.isatty(),
    "write_through": sys.stdout.write_through,
    "aelastic_loaded": any(m.startswith("aelastic") for m in sys.modules),
}
print(json.dumps(out, sort_keys=True))
"""


def _spec(args: Sequence[str], tmp: Path, tag: str, **kw: object) -> ProcessSpec:
    options: dict[str, object] = dict(
        local_rank=0,
        args=list(args),
        env={**os.environ, "WARM_TEST": tag},
        stdout_file=str(tmp / f"{tag}.out"),
        stderr_file=str(tmp / f"{tag}.err"),
    )
    options.update(kw)
    return ProcessSpec(**options)  # type: ignore[arg-type]


async def _run(spec: ProcessSpec, pool: WarmPool | None) -> tuple[int, bool]:
    """Run one worker to its end: ``(exitcode, ran_warm)``."""
    with anyio.fail_after(30):
        async with open_worker_processes([spec], warm_pool=pool) as procs:
            exits = await procs.wait_all()
            return exits[spec.local_rank].exitcode, spec.local_rank in procs.warm_ranks


async def _side_by_side(
    args: Sequence[str], tmp: Path, **kw: object
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """``(exitcode, stdout, stderr)`` of a fresh spawn and of a warm start of ``args``."""
    entry = parse_python_argv(args)
    assert entry is not None, args
    results = []
    async with open_warm_pool(entry.prefix, 1) as pool:
        for tag, use in (("fresh", None), ("warm", pool)):
            idle = set(pool.idle_pids)
            spec = _spec(args, tmp, tag, **kw)
            code, warm = await _run(spec, use)
            assert warm is (use is not None)
            if warm:
                assert idle, "the pool had no idle interpreter"
            out = (tmp / f"{tag}.out").read_text()
            err = (tmp / f"{tag}.err").read_text()
            results.append((code, out, err))
    return results[0], results[1]


def _relpath(path: str, start: Path) -> str:
    return os.path.relpath(path, start)


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


async def test_script_sees_what_a_fresh_interpreter_sees(tmp_path: Path) -> None:
    script = _write(tmp_path / "pkg dir" / "probe.py", PROBE)
    workdir = tmp_path / "work"
    workdir.mkdir()
    rel = _relpath(script, workdir)
    fresh, warm = await _side_by_side([PY, "-u", rel, "a", "--b", "ü"], tmp_path, cwd=str(workdir))
    assert fresh[0] == warm[0] == 0, (fresh, warm)
    f, w = json.loads(fresh[1]), json.loads(warm[1])
    assert f["env"].pop("WARM_TEST") == "fresh" and w["env"].pop("WARM_TEST") == "warm"
    assert w == f
    assert (
        w["name"] == "__main__"
        and w["file"] == os.path.join(workdir, rel)
        and w["argv"] == [rel, "a", "--b", "ü"]
    )
    assert w["path0"] == os.path.dirname(script) and w["cwd"] == str(workdir)
    assert not w["aelastic_loaded"] and w["main_is_module"]


async def test_an_environment_larger_than_the_socket_buffer_arrives_whole(tmp_path: Path) -> None:
    """The activation goes out in one sendmsg when it fits the socket buffer; a larger
    one (here 480 kB of environment) must still arrive whole, the rest sent after."""
    script = _write(tmp_path / "env.py", PRINT_BIG)
    big = {f"BIG{i}": f"{i}" * 120_000 for i in range(4)}  # each below MAX_ARG_STRLEN
    fresh, warm = await _side_by_side([PY, "-u", script], tmp_path, env={**os.environ, **big})
    expected = "".join(f"BIG{i} {len(v)} {v[-3:]}\n" for i, v in enumerate(big.values()))
    assert fresh == warm == (0, expected, "")


PRINT_BIG = """\
import os
for name in sorted(k for k in os.environ if k.startswith("BIG")):
    print(name, len(os.environ[name]), os.environ[name][-3:])
"""


async def test_module_entrypoint(tmp_path: Path) -> None:
    _write(tmp_path / "mypkg" / "__init__.py", "")
    _write(tmp_path / "mypkg" / "probe.py", PROBE)
    fresh, warm = await _side_by_side(
        [PY, "-u", "-m", "mypkg.probe", "x"], tmp_path, cwd=str(tmp_path)
    )
    assert fresh[0] == warm[0] == 0, (fresh, warm)
    f, w = json.loads(fresh[1]), json.loads(warm[1])
    f["env"].pop("WARM_TEST"), w["env"].pop("WARM_TEST")
    assert w == f
    assert w["argv"] == [str(tmp_path / "mypkg" / "probe.py"), "x"]
    assert w["path0"] == str(tmp_path)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("import sys\nsys.exit(7)\n", 7),
        ("import sys\nprint('out')\nsys.exit('bye')\n", 1),
        (
            "def f():\n    raise ValueError('boom')\ntry:\n    f()\nexcept ValueError as e:\n"
            "    raise KeyError('k') from e\n",
            1,
        ),
        ("import atexit\natexit.register(print, 'atexit ran')\nraise SystemExit\n", 0),
        ("def (:\n", 1),
        ("import os\nos._exit(4)\n", 4),
        ("raise KeyboardInterrupt\n", -2),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", -15),
    ],
    ids=["exit7", "exit-msg", "chained", "atexit", "syntax", "os-exit", "interrupt", "sigterm"],
)
async def test_exit_codes_and_tracebacks_match(tmp_path: Path, body: str, code: int) -> None:
    script = _write(tmp_path / "s.py", body)
    fresh, warm = await _side_by_side([PY, "-u", script], tmp_path)
    assert fresh == warm
    assert warm[0] == code


async def test_module_not_found_matches(tmp_path: Path) -> None:
    fresh, warm = await _side_by_side([PY, "-u", "-m", "no_such_mod_xyz"], tmp_path)
    assert fresh == warm and warm[0] == 1


async def test_tee_and_prefix_output_identical(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = _write(
        tmp_path / "talk.py",
        "import sys\nprint('line one')\nprint('err line', file=sys.stderr)\n"
        "print('tail', end='')\n",
    )
    fresh, warm = await _side_by_side(
        [PY, "-u", script], tmp_path, tee=Std.ALL, console_prefix="[r0]:"
    )
    assert fresh == warm == (0, "line one\ntail", "err line\n")
    console = capfd.readouterr()
    assert console.out.count("[r0]:line one\n") == 2 and console.out.count("[r0]:tail\n") == 2
    assert console.err.count("[r0]:err line\n") == 2


async def test_console_and_filtered_output(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = _write(tmp_path / "say.py", "import sys\nprint('hi-' + sys.argv[1])\n")
    entry = parse_python_argv([PY, "-u", script])
    assert entry is not None
    async with open_warm_pool(entry.prefix, 2) as pool:
        shown = ProcessSpec(0, [PY, "-u", script, "shown"], dict(os.environ))
        hidden = ProcessSpec(
            1, [PY, "-u", script, "hidden"], dict(os.environ), show_on_console=False
        )
        with anyio.fail_after(30):
            async with open_worker_processes([shown, hidden], warm_pool=pool) as procs:
                await procs.wait_all()
                assert procs.warm_ranks == {0, 1}
    console = capfd.readouterr()
    assert "hi-shown\n" in console.out and "hidden" not in console.out + console.err


SIGNAL_PROBE = """\
import json, signal
skip = {signal.SIGKILL, signal.SIGSTOP}
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({
    "handlers": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals() if s not in skip},
    "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ())),
    "kernel": {k: status[k].strip() for k in ("SigIgn", "SigCgt", "SigBlk")},
}))
"""


@contextmanager
def _signal_state(
    ignore: Sequence[int], block: Sequence[int], default: Sequence[int] = ()
) -> Iterator[None]:
    """This process ignores ``ignore`` and leaves ``default`` at ``SIG_DFL`` (whatever the
    suite inherited: ``nohup`` ignores SIGHUP), and this thread blocks ``block``, inside
    the block."""
    saved = {sig: signal.getsignal(sig) for sig in (*ignore, *default)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, block)
    try:
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)
        for sig in default:
            signal.signal(sig, signal.SIG_DFL)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


async def test_signal_state_is_a_fresh_spawns_not_the_prestarted_ones(tmp_path: Path) -> None:
    """Issue 10 item 7: interpreters pre-started while SIGINT/SIGHUP were ignored (``nohup``,
    ``&``) must not keep them ignored once the agent handles them; the mask likewise."""
    script = _write(tmp_path / "sigprobe.py", SIGNAL_PROBE)
    entry = parse_python_argv([PY, "-u", script])
    assert entry is not None
    with _signal_state([signal.SIGINT, signal.SIGHUP], [signal.SIGUSR2]):
        pool_cm = open_warm_pool(entry.prefix, 1)
        pool = await pool_cm.__aenter__()
    try:
        # Now the agent ignores SIGUSR1, blocks SIGWINCH and leaves SIGHUP at its default:
        # a fresh spawn inherits that.
        with _signal_state([signal.SIGUSR1], [signal.SIGWINCH], [signal.SIGHUP]):
            results = []
            for tag, use in (("fresh", None), ("warm", pool)):
                code, warm = await _run(_spec([PY, "-u", script], tmp_path, tag), use)
                assert code == 0 and warm is (use is not None)
                results.append(json.loads((tmp_path / f"{tag}.out").read_text()))
    finally:
        await pool_cm.__aexit__(None, None, None)
    fresh, warm = results
    assert warm == fresh
    assert warm["handlers"][str(int(signal.SIGINT))] == str(signal.default_int_handler)
    assert warm["handlers"][str(int(signal.SIGHUP))] == str(signal.SIG_DFL)
    assert warm["handlers"][str(int(signal.SIGUSR1))] == str(signal.SIG_IGN)
    assert warm["blocked"] == [int(signal.SIGWINCH)]


@pytest.mark.parametrize(
    "change",
    [{"PYTHONHASHSEED": "123"}, {"PYTHONPATH": "/nonexistent"}, {"LC_ALL": "C"}],
    ids=["hashseed", "pythonpath", "locale"],
)
async def test_startup_env_mismatch_falls_back_to_fresh(
    tmp_path: Path, change: Mapping[str, str]
) -> None:
    script = _write(tmp_path / "probe.py", PROBE)
    entry = parse_python_argv([PY, "-u", script])
    assert entry is not None
    async with open_warm_pool(entry.prefix, 1) as pool:
        idle = pool.idle_pids
        spec = _spec([PY, "-u", script], tmp_path, "x", env={**os.environ, **change})
        code, warm = await _run(spec, pool)
        assert code == 0 and not warm
        assert pool.idle_pids == idle  # untouched
    seen = json.loads((tmp_path / "x.out").read_text())
    for key, value in change.items():
        assert seen["env"][key] == value


@pytest.mark.parametrize(
    "argv",
    [
        ["/bin/echo", "-u", "x.py"],
        [PY, "x.py"],  # no -u: buffering would differ
        [PY, "-u", "-c", "print(1)"],
        [PY, "-I", "-u", "x.py"],
        ["python", "-u", "x.py"],  # not an absolute path
        [PY, "-u"],
    ],
)
def test_argv_a_warm_interpreter_cannot_run(argv: list[str]) -> None:
    assert parse_python_argv(argv) is None


def test_argv_parsing() -> None:
    entry = parse_python_argv([PY, "-u", "-X", "dev", "-W", "error", "-m", "pkg.mod", "-u", "a"])
    assert entry is not None
    assert entry.prefix == (PY, "-u", "-X", "dev", "-W", "error")
    assert (entry.kind, entry.target, entry.args) == ("module", "pkg.mod", ("-u", "a"))


async def test_pool_close_leaves_no_processes_or_fds(tmp_path: Path) -> None:
    script = _write(tmp_path / "ok.py", "pass\n")
    entry = parse_python_argv([PY, "-u", script])
    assert entry is not None
    fds_before = set(os.listdir("/proc/self/fd"))
    async with open_warm_pool(entry.prefix, 2, replenish_delay=0.0) as pool:
        first = set(pool.idle_pids)
        assert len(first) == 2
        code, warm = await _run(_spec([PY, "-u", script], tmp_path, "a"), pool)
        assert code == 0 and warm
        # Replacements are started in the background after an activation.
        with anyio.fail_after(10):
            await pool.wait_ready()
        assert len(pool.idle_pids) == 2 and len(set(pool.idle_pids) - first) == 1
        spawned = set(pool.idle_pids) | first
    assert not pool.idle_pids
    for pid in spawned:
        assert _gone(pid), f"pid {pid} left behind"
    assert set(os.listdir("/proc/self/fd")) == fds_before


async def test_pool_close_on_cancellation(tmp_path: Path) -> None:
    fds_before = set(os.listdir("/proc/self/fd"))
    pids: list[int] = []
    with anyio.CancelScope() as scope:
        async with open_warm_pool((PY, "-u"), 2) as pool:
            pids = pool.idle_pids
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught and len(pids) == 2
    for pid in pids:
        assert _gone(pid)
    assert set(os.listdir("/proc/self/fd")) == fds_before


async def test_dead_idle_interpreter_is_skipped(tmp_path: Path) -> None:
    script = _write(tmp_path / "ok.py", "print('ran')\n")
    entry = parse_python_argv([PY, "-u", script])
    assert entry is not None
    async with open_warm_pool(entry.prefix, 1) as pool:
        (pid,) = pool.idle_pids
        os.killpg(pid, 9)
        with anyio.fail_after(10):
            pidfd = os.pidfd_open(pid)
            try:
                await anyio.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        code, warm = await _run(_spec([PY, "-u", script], tmp_path, "d"), pool)
        assert code == 0 and not warm
    assert (tmp_path / "d.out").read_text() == "ran\n"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AELASTIC_WARM_WORKERS": "0"}, False),
        ({"AELASTIC_WARM_WORKERS": "off"}, False),
        ({"AELASTIC_CHILD_WATCHER": "thread"}, True),  # a waiting thread follows them too
        ({"AELASTIC_WARM_WORKERS": "1"}, True),
        ({}, True),
    ],
)
def test_enabled_switch(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: bool
) -> None:
    monkeypatch.delenv("AELASTIC_WARM_WORKERS", raising=False)
    monkeypatch.delenv("AELASTIC_CHILD_WATCHER", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert warm_workers_enabled() is expected


def _prestarted_pids() -> set[int]:
    held = _warm._prestarted
    return set() if held is None else {w.pid for w in held.procs}


async def test_prestarted_interpreters_are_adopted(tmp_path: Path) -> None:
    script = _write(tmp_path / "ok.py", "print('adopted')\n")
    assert prestart_warm_workers([PY, "-u", script], 2)
    early = _prestarted_pids()
    assert len(early) == 2
    assert not prestart_warm_workers([PY, "-u", script], 2)  # one set at a time
    async with open_warm_pool((PY, "-u"), 2) as pool:
        assert set(pool.idle_pids) == early and _warm._prestarted is None
        code, warm = await _run(_spec([PY, "-u", script], tmp_path, "p"), pool)
        assert code == 0 and warm
    assert (tmp_path / "p.out").read_text() == "adopted\n"
    assert all(_gone(pid) for pid in early)


async def test_prestarted_mismatch_is_discarded(tmp_path: Path) -> None:
    assert prestart_warm_workers([PY, "-u", "-B", "x.py"], 1)
    early = _prestarted_pids()
    async with open_warm_pool((PY, "-u"), 1) as pool:
        assert not early & set(pool.idle_pids)
    assert _warm._prestarted is None
    assert all(_gone(pid) for pid in early)


def test_prestart_refuses_what_cannot_run_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not prestart_warm_workers(["/bin/echo", "-u", "x.py"], 2)
    monkeypatch.setenv("AELASTIC_WARM_WORKERS", "0")
    assert not prestart_warm_workers([PY, "-u", "x.py"], 2)
    assert _warm._prestarted is None
