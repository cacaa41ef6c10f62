"""A whole Slurm cluster on this machine, for tests: munged, one slurmctld, three slurmd.

Debian's ``slurm-wlm`` build lets several ``slurmd`` run on one host (``-N name``). Every
file lives in a private temporary directory (key, sockets, pids, logs, spool, state and
``slurm.conf``); nothing under ``/etc`` is read or written. Every daemon runs in the
foreground as a child of this process, so it is stopped by its own pid.

Use::

    with slurm_cluster() as cluster:
        subprocess.run(["srun", "-N3", "-n3", "hostname"], env=cluster.env, check=True)

``cluster.env`` is this process's environment plus ``SLURM_CONF``; it carries no
``SLURM_*`` variable of an enclosing job. ``cluster.nodes`` is ``("n1", "n2", "n3")``,
all with ``NodeAddr=127.0.0.1``.

The cluster reacts as fast as Slurm allows (see ``_write_conf``): a requeued job is held
``cred_expire`` + 1 = 6 s and the scheduler looks every second. Its job ids start at
``cluster.first_job_id``, a block of ids no other test cluster on this host uses at the same
time (``_claim_job_ids``), so jobs of two clusters (two xdist workers, a test beside
``benchmarks/preemption.py --slurm``) derive different rendezvous ports from their ids.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _ports import free_ports

from aelastic.schedulers._slurm import rendezvous_port

NODES = ("n1", "n2", "n3")
START_TIMEOUT = 60.0
#: a job's states once it is over (``scontrol show job``'s ``JobState``)
FINISHED = frozenset(
    ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")
)
#: job ids this far apart derive the same rendezvous port (375 for 16 * job id modulo
#: 3000 ports); ids closer together never do, for steps 0..7
PORT_PERIOD = next(n for n in range(1, 1 << 16) if rendezvous_port(n, 0) == rendezvous_port(0, 0))
#: job ids per cluster: a cluster's 33rd job runs into the next cluster's ids
JOB_ID_BLOCK = 32


@dataclass
class SlurmCluster:
    """A running cluster: the environment to call ``srun``/``sbatch``/``scontrol`` with."""

    root: Path
    env: dict[str, str]
    first_job_id: int = 1
    nodes: tuple[str, ...] = NODES
    logs: dict[str, Path] = field(default_factory=dict)

    def run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster; raise with its output if it fails."""
        done = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def job_state(self, job_id: str) -> str:
        """The job's ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETED``, ...): Slurm keeps a
        finished job's record ``MinJobAge`` (300 s)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        found = re.search(r"\bJobState=(\S+)", out)
        return found.group(1) if found else f"(no JobState in {out!r})"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of every daemon's log, for a failure message."""
        out = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            out.append(f"--- {name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)


def _wait(
    condition: str, check: object, cluster: SlurmCluster, procs: dict[str, subprocess.Popen[bytes]]
) -> None:
    """Poll ``check()`` until true; fail with the daemons' logs if one ended or time ran out."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        assert callable(check)
        if check():
            return
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited {proc.returncode} while waiting for {condition}\n"
                    + cluster.log_tail()
                )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"timed out after {START_TIMEOUT:.0f} s waiting for {condition}\n"
                + cluster.log_tail()
            )
        time.sleep(0.1)


def until(what: str, done: Callable[[], bool], seconds: float, why: Callable[[], str]) -> None:
    """Poll ``done()`` (a job's output, a node's state) every 0.2 s for up to ``seconds``;
    fail naming ``what`` with ``why()`` (the job's log) when it never holds."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s\n{why()}")
        time.sleep(0.2)


@contextlib.contextmanager
def _claim_job_ids() -> Iterator[int]:
    """Hold a block of ``JOB_ID_BLOCK`` job ids whose derived ports no other block's ids
    derive, and yield its first id (the cluster's ``FirstJobId``); released on exit, or
    when this process dies.

    The blocks split ``PORT_PERIOD`` ids: 1..10 are handed out (block 0, ids 1..32, is
    where a cluster that sets no ``FirstJobId`` starts). A block is held by binding a Linux
    abstract socket named after it: nothing on disk, gone with its holder. With every block
    held (10 clusters at once) one is picked at random and ports may collide, as before.
    """
    blocks = PORT_PERIOD // JOB_ID_BLOCK  # 11 for 375: 0..10
    for block in range(1, blocks):
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            claim.bind(f"\0aelastic-test-slurm-job-ids-{block}")
        except OSError:  # another cluster holds it
            claim.close()
            continue
        with claim:
            yield 1 + block * JOB_ID_BLOCK
        return
    yield 1 + (1 + secrets.randbelow(blocks - 1)) * JOB_ID_BLOCK


def _write_conf(
    root: Path, munge_socket: Path, ctld_port: int, slurmd_port: int, first_job_id: int
) -> Path:
    """The cluster's ``slurm.conf``: Slurm's defaults, except where a test cluster on one
    machine needs other values (ports, paths, users) or can react faster (the timers)."""
    host = socket.gethostname()
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    lines = [
        "ClusterName=aelastic",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        # cred_expire: how long a killed job's credential stays revoked, and so how long
        # Slurm holds a requeued job (cred_expire + 1 s from the old job's end; 120 s by
        # default; starting it sooner got "Job credential revoked"). 5 s, Slurm's minimum
        # (less is refused and means 120): an srun's launch must also reach the slurmd
        # within it, which takes well under a second here ("Credential expired" otherwise)
        f"AuthInfo=socket={munge_socket},cred_expire=5",
        "CredType=cred/munge",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        # nothing wakes the scheduler when a requeued job's hold ends: it waits for the
        # main loop's full pass (sched_interval, 60 s by default) or the backfill pass
        # (bf_interval, 30 s); both every second here, and a submitted job is scheduled at
        # the loop's next second (batch_sched_delay, 3 s by default)
        "SchedulerParameters=sched_interval=1,bf_interval=1,batch_sched_delay=0",
        f"FirstJobId={first_job_id}",
        "ReturnToService=2",
        "MinJobAge=300",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "MessageTimeout=30",
        "JobRequeue=1",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd'}-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"PlugStackConfig={root / 'plugstack.conf'}",
        f"NodeName=n[1-3] NodeHostname={host} NodeAddr=127.0.0.1 "
        f"Port=[{slurmd_port}-{slurmd_port + 2}] CPUs=2 State=UNKNOWN",
        "PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE",
    ]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    (root / "plugstack.conf").write_text("")
    return conf


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM every daemon by pid (slurmd first, munged last), then SIGKILL what remains."""
    for name in reversed(list(procs)):
        proc = procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd n1..n3; yield once ``sinfo`` shows all idle.

    Raises ``RuntimeError`` with the daemons' log tails if one exits or the cluster is not
    idle within ``START_TIMEOUT``. On exit (also on error or KeyboardInterrupt) every
    daemon it started is stopped by pid and the temporary directory removed.
    """
    root = Path(tempfile.mkdtemp(prefix="aelastic-slurm-"))
    os.chmod(root, 0o755)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    claim = contextlib.ExitStack()
    try:
        first_job_id = claim.enter_context(_claim_job_ids())
        for sub in ("state", "spool", "munge"):
            (root / sub).mkdir(mode=0o755)
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        munge_socket = root / "munge" / "munge.socket"
        ctld_port = free_ports(1)
        slurmd_port = free_ports(len(NODES))
        conf = _write_conf(root, munge_socket, ctld_port, slurmd_port, first_job_id)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
        }
        env["SLURM_CONF"] = str(conf)
        cluster = SlurmCluster(root=root, env=env, first_job_id=first_job_id)
        cluster.logs["munged"] = root / "munge" / "munged.log"
        cluster.logs["slurmctld"] = root / "slurmctld.log"
        for node in NODES:
            cluster.logs[f"slurmd {node}"] = root / f"slurmd-{node}.log"

        def start(name: str, argv: list[str]) -> None:
            with open(root / f"{name.replace(' ', '-')}.stderr", "wb") as err:
                procs[name] = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
                )

        start(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={root / 'munge' / 'munged.pid'}",
                f"--log-file={root / 'munge' / 'munged.log'}",
                f"--seed-file={root / 'munge' / 'munged.seed'}",
            ],
        )
        _wait("munged's socket", munge_socket.exists, cluster, procs)
        start("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(conf)])
        for node in NODES:
            start(f"slurmd {node}", ["slurmd", "-D", "-N", node, "-f", str(conf)])

        def all_idle() -> bool:
            done = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            return all(states.get(node) == "idle" for node in NODES)

        _wait("sinfo to show n[1-3] idle", all_idle, cluster, procs)
        yield cluster
    finally:
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)
        claim.close()
