"""Start one launcher run for a benchmark: its own session (so a hung run is killed with
its workers by one ``os.killpg``), stdout discarded, stderr to a file for the report."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_job(
    argv: Sequence[str], env: Mapping[str, str], err_path: str
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the repository's root with ``env``; stderr goes to ``err_path``."""
    with open(err_path, "wb") as err_file:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            start_new_session=True,
        )
