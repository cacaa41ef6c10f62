"""Kubeflow Trainer's status server, played by a real HTTPS server on loopback with a CA
made for the test (``openssl``), fed by a real ``python -m aelastic run`` job in the
environment Kubeflow Trainer gives a trainer pod."""

from __future__ import annotations

import calendar
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ports import free_port  # tests/ is on sys.path

from aelastic.schedulers._kubeflow import TrainerStatusTarget, status_payload

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/demo/status"
BOUND = 120.0  # seconds any wait may take on a loaded machine

# Steps until a stop file appears (the test decides when it has seen enough).
WORKER = """\
import os, sys, time
from aelastic.progress import step
stop, deadline = sys.argv[1], time.monotonic() + 120
while not os.path.exists(stop) and time.monotonic() < deadline:
    step()
    time.sleep(0.02)
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(d: Path, name: str) -> None:
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *curve, "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "1", "-subj", f"/CN={name}", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ca.crt`` signed ``server.crt`` (for 127.0.0.1); ``other.crt`` is an unrelated CA."""
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj",
             "/CN=status-server", cwd=d)  # fmt: skip
    (d / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid\n"
        "basicConstraints=critical,CA:FALSE\nkeyUsage=digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext.cnf",
             cwd=d)  # fmt: skip
    return d


class StatusServer(http.server.ThreadingHTTPServer):
    """Records each POST (path, Authorization, JSON body); ``hang`` holds every request
    until ``release`` is set. Counts TLS connections, handshakes that failed included."""

    daemon_threads = True

    def __init__(self, pki: Path, *, hang: bool = False, reply: int = 200) -> None:
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(pki / "server.crt", pki / "server.key")
        self.hang = hang
        self.reply = reply
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.posts: list[dict[str, Any]] = []
        self.connections = 0
        self.held = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        with self.cond:
            self.connections += 1
            self.cond.notify_all()
        sock.settimeout(30)
        try:
            return self.tls.wrap_socket(sock, server_side=True), addr
        except OSError:
            sock.close()
            raise

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}{STATUS_PATH}"

    def wait_for(self, what: str, predicate: Any) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: predicate(self), timeout=BOUND):
                raise AssertionError(f"no {what} within {BOUND} s: {self.posts}")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: StatusServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        post = {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        if self.server.hang:
            with self.server.cond:
                self.server.held += 1
                self.server.cond.notify_all()
            self.server.release.wait(BOUND)
            return
        with self.server.cond:
            self.server.posts.append(post)
            self.server.cond.notify_all()
        reply = json.dumps(body).encode()
        self.send_response(self.server.reply)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def serve(pki: Path) -> Iterator[Any]:
    servers: list[StatusServer] = []

    def start(*, hang: bool = False, reply: int = 200) -> StatusServer:
        server = StatusServer(pki, hang=hang, reply=reply)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


def _start_job(
    tmp_path: Path, url: str, ca: Path, token: Path, *, index: int = 0, port: int | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """One trainer pod's launcher; with ``port``, one of two nodes of a c10d job there."""
    script = tmp_path / "steps.py"
    script.write_text(WORKER)
    stop = tmp_path / "stop"
    env = {
        **os.environ,
        # as Kubeflow Trainer sets them in a trainer pod
        "KUBEFLOW_TRAINER_SERVER_URL": url,
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(ca),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token),
        "JOB_COMPLETION_INDEX": str(index),
        "PET_NNODES": "1" if port is None else "2",
        "PET_NPROC_PER_NODE": "1",
        "AELASTIC_TRAINER_STATUS_INTERVAL": "0.1",
        "AELASTIC_TOTAL_STEPS": "1000000",
    }
    if port is None:
        rdzv = ["--standalone"]
    else:
        endpoint = f"127.0.0.1:{port}"
        conf = f"is_host={int(index == 0)}"
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-conf", conf]
        rdzv += ["--rdzv-id", "kubeflow"]
    argv = [sys.executable, "-m", "aelastic", "run", *rdzv, str(script), str(stop)]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, stop


def _finish(proc: subprocess.Popen[str], stop: Path) -> tuple[int, str]:
    stop.write_text("")
    try:
        _, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def _metric(post: dict[str, Any], name: str) -> str | None:
    metrics = post["body"]["trainerStatus"].get("metrics", [])
    return next((m["value"] for m in metrics if m["name"] == name), None)


def _steps(server: StatusServer) -> list[int]:
    return [int(s) for p in server.posts if (s := _metric(p, "step")) is not None]


def test_a_job_posts_its_steps_and_goodput_with_the_rotated_token(
    tmp_path: Path, pki: Path, serve: Any
) -> None:
    server = serve()
    token = tmp_path / "token"
    token.write_text("first-jwt\n")
    proc, stop = _start_job(tmp_path, server.url, pki / "ca.crt", token)
    try:
        server.wait_for("two posts with steps", lambda s: len(set(_steps(s))) >= 2)
        token.write_text("second-jwt\n")  # the kubelet rotates the projected token
        server.wait_for(
            "a post with the new token", lambda s: s.posts[-1]["auth"] == "Bearer second-jwt"
        )
        server.wait_for("a third step", lambda s: len(set(_steps(s))) >= 3)
    finally:
        code, err = _finish(proc, stop)
    assert code == 0, err
    posts = server.posts
    assert {p["path"] for p in posts} == {STATUS_PATH}
    auths = [p["auth"] for p in posts]
    first_new = auths.index("Bearer second-jwt")
    assert set(auths[:first_new]) == {"Bearer first-jwt"}, auths
    assert set(auths[first_new:]) == {"Bearer second-jwt"}, auths
    steps = _steps(server)
    assert steps == sorted(steps) and steps[-1] > steps[0] > 0, steps
    for post in posts:
        status = post["body"]["trainerStatus"]
        assert status["lastUpdatedTime"].endswith("Z")
        if _metric(post, "step") is not None:  # steps reported: the goodput is known too
            assert 0.0 <= float(_metric(post, "goodput") or "nan") <= 1.0, post
            assert status["progressPercentage"] == 0, post  # of a million steps
    assert "not posted" not in err


def test_only_one_node_of_a_job_posts(tmp_path: Path, pki: Path, serve: Any) -> None:
    server = serve()
    port = free_port()
    procs = []
    for index in (0, 1):  # each pod's token names it
        token = tmp_path / f"token-{index}"
        token.write_text(f"pod-{index}\n")
        procs.append(
            _start_job(tmp_path, server.url, pki / "ca.crt", token, index=index, port=port)
        )
    try:
        server.wait_for("three posts with steps", lambda s: len(set(_steps(s))) >= 3)
    finally:
        results = [_finish(proc, stop) for proc, stop in procs]
    assert [code for code, _ in results] == [0, 0], results
    assert len({p["auth"] for p in server.posts}) == 1, server.posts


def test_a_hanging_server_does_not_hold_the_job(tmp_path: Path, pki: Path, serve: Any) -> None:
    server = serve(hang=True)
    token = tmp_path / "token"
    token.write_text("jwt\n")
    proc, stop = _start_job(tmp_path, server.url, pki / "ca.crt", token)
    try:
        server.wait_for("a post", lambda s: s.held >= 1)
    finally:
        code, err = _finish(proc, stop)  # the job ends while its post still hangs
    assert code == 0, err
    assert not server.release.is_set() and server.posts == []


def test_a_wrong_ca_posts_nothing_and_warns_once(tmp_path: Path, pki: Path, serve: Any) -> None:
    server = serve()
    token = tmp_path / "token"
    token.write_text("jwt\n")
    proc, stop = _start_job(tmp_path, server.url, pki / "other.crt", token)
    try:
        server.wait_for("three tries", lambda s: s.connections >= 3)
    finally:
        code, err = _finish(proc, stop)
    assert code == 0, err
    assert server.posts == []
    warnings = [line for line in err.splitlines() if "Kubeflow Trainer status not posted" in line]
    assert len(warnings) == 1, err
    assert "CERTIFICATE_VERIFY_FAILED" in warnings[0], warnings


def test_a_refused_connection_is_a_failure_not_an_error() -> None:
    from aelastic.schedulers._kubeflow import post_status

    port = free_port()  # a port nothing listens on
    target = TrainerStatusTarget(url=f"https://127.0.0.1:{port}{STATUS_PATH}")
    with pytest.raises(OSError):
        post_status(target, status_payload(1, 0.5), timeout=10)


def test_the_payload_follows_kubeflows_schema() -> None:
    when = calendar.timegm((2026, 3, 1, 12, 0, 0))
    assert status_payload(250, 0.91234, total_steps=1000, steps_per_s=5.0, now=when) == {
        "trainerStatus": {
            "lastUpdatedTime": "2026-03-01T12:00:00Z",
            "progressPercentage": 25,
            "estimatedRemainingSeconds": 150,
            "metrics": [{"name": "step", "value": "250"}, {"name": "goodput", "value": "0.9123"}],
        }
    }
    assert status_payload(None, None, now=when) == {
        "trainerStatus": {"lastUpdatedTime": "2026-03-01T12:00:00Z"}
    }
    assert status_payload(5000, 1.0, total_steps=1000)["trainerStatus"]["progressPercentage"] == 100


def test_the_target_reads_kubeflows_variables() -> None:
    assert TrainerStatusTarget.from_env({}) is None
    env = {
        "KUBEFLOW_TRAINER_SERVER_URL": "https://trainer.kubeflow.svc:8082" + STATUS_PATH,
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": "/var/run/secrets/kubeflow/trainer/ca.crt",
        "KUBEFLOW_TRAINER_SERVER_TOKEN": "/var/run/secrets/kubeflow/trainer/token",
        "AELASTIC_TOTAL_STEPS": "nope",
    }
    target = TrainerStatusTarget.from_env(env)
    assert target is not None
    assert (target.ca_file, target.token_file) == (
        "/var/run/secrets/kubeflow/trainer/ca.crt",
        "/var/run/secrets/kubeflow/trainer/token",
    )
    assert target.total_steps is None and target.interval == 5.0


async def test_cancelling_the_poster_leaves_a_hanging_post_behind(pki: Path, serve: Any) -> None:
    """The post's own bound (600 s here) is not waited for: cancelling the poster (the
    job ends) returns at once, the post's thread is left to time out alone."""
    import anyio

    from aelastic.schedulers._kubeflow import TrainerStatusPoster

    server = serve(hang=True)
    target = TrainerStatusTarget(url=server.url, ca_file=str(pki / "ca.crt"))
    poster = TrainerStatusPoster(target, step=lambda: 7, goodput=lambda: 1.0, timeout=600)
    with anyio.fail_after(BOUND):  # a failure bound only: a poster that waited takes 600 s
        async with anyio.create_task_group() as tg:
            await tg.start(poster.run)
            await anyio.to_thread.run_sync(server.wait_for, "a post", lambda s: s.held >= 1)
            tg.cancel_scope.cancel()
    assert (poster.posted, poster.failed) == (0, 0) and not server.release.is_set()


async def test_a_refusing_server_is_warned_about_once(
    pki: Path, serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """HTTP 403 (a token the server does not accept): no error, one warning."""
    from aelastic.schedulers._kubeflow import TrainerStatusPoster

    server = serve(reply=403)
    target = TrainerStatusTarget(url=server.url, ca_file=str(pki / "ca.crt"))
    steps = iter(range(1, 100))
    poster = TrainerStatusPoster(target, step=lambda: next(steps), goodput=lambda: 0.5)
    with caplog.at_level("DEBUG", logger="aelastic.schedulers"):
        assert [await poster.post_once() for _ in range(3)] == [False, False, False]
    assert (poster.posted, poster.failed, len(server.posts)) == (0, 3, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "HTTP 403" in warnings[0], warnings
