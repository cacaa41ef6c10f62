"""Package-level contracts: public surface and the torch-free agent path."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys, importlib\n"
        "for m in ('aelastic', 'aelastic.cli', 'aelastic.store', 'aelastic.rendezvous'):\n"
        "    importlib.import_module(m)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_command_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aelastic", "nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "unknown command 'nope'" in proc.stderr


def _newly_imported(code: str) -> set[str]:
    """Modules that ``code`` imported in a fresh interpreter (start-up's own excluded)."""
    script = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_launch_path_skips_modules_it_does_not_need() -> None:
    # `aelastic run` start-up cost: these are only needed off the launch path
    # (uuid pulls in platform; ctypes is for the preexec pdeathsig mode only;
    # datetime only formats a failure).
    new = _newly_imported(
        "import aelastic.cli, aelastic.launcher._cli, aelastic.launcher._args\n"
        "import aelastic.launcher._launch\n"
        "import aelastic.agent, aelastic.workers, aelastic.rendezvous, aelastic.store"
    )
    assert "aelastic.agent" in new
    assert not new & {"torch", "uuid", "platform", "ctypes", "datetime"}


def test_worker_prestart_needs_neither_asyncio_nor_anyio() -> None:
    # `aelastic run` starts the workers' interpreters right after parsing its
    # arguments, before the agent's heavy imports; this keeps that early.
    new = _newly_imported(
        "import aelastic.launcher._cli, aelastic.launcher._args\n"
        "from aelastic.workers import Std\n"
        "from aelastic.workers._std import to_map\n"
        "from aelastic.workers._warm import prestart_warm_workers"
    )
    assert "aelastic.workers._warm" in new
    assert not new & {"asyncio", "anyio", "aelastic.workers._processes"}


def test_etcd_backend_is_imported_only_when_an_etcd_handler_is_built() -> None:
    # grpc and aetcd cost ~100 ms: `import aelastic.rendezvous` must not pull them in;
    # the registry imports aelastic.rendezvous.etcd on the first etcd handler.
    etcd_modules = {"grpc", "aetcd", "aelastic.rendezvous.etcd"}
    assert not _newly_imported("import aelastic.rendezvous") & etcd_modules
    pytest.importorskip("aetcd")
    new = _newly_imported(
        "from aelastic.rendezvous import RendezvousParameters\n"
        "from aelastic.rendezvous._registry import create_handler\n"
        "create_handler(RendezvousParameters('etcd', '127.0.0.1:1', 'job', 1, 1))"
    )
    assert etcd_modules <= new


def test_etcd_backend_without_its_extra_is_one_clear_error() -> None:
    # Without aetcd (the 'etcd' extra) asking for the backend names the extra and the
    # alternative, as a RendezvousError, instead of a bare ImportError from deep inside.
    code = (
        "import sys\n"
        "sys.modules['aetcd'] = None\n"  # what a machine without the extra sees
        "from aelastic.rendezvous import RendezvousError, RendezvousParameters\n"
        "from aelastic.rendezvous._registry import create_handler\n"
        "try:\n"
        "    create_handler(RendezvousParameters('etcd', '127.0.0.1:1', 'job', 1, 1))\n"
        "except RendezvousError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "aelastic[etcd]" in out.stdout
    assert "--rdzv-backend c10d" in out.stdout
