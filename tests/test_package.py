"""Package-level contracts: public surface and the torch-free agent path."""

from __future__ import annotations

import subprocess
import sys


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
