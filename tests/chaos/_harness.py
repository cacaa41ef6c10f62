"""Seeded chaos trials: a 3-node elastic gloo job on loopback, one fault each.

A trial starts three launcher processes (``--nnodes 2:3 --max-restarts 3``, c10d rendezvous
on 127.0.0.1, node 0 hosts the store), each with one worker running ``chaos_worker.py`` (a
checkpointing gloo job), injects one :class:`Fault` at a phase, and waits for every
launcher to exit within a bound. :func:`run_trial` returns what happened; the assertions
every trial must pass live in :meth:`TrialResult.problems`:

* no launcher still running after the bound (no hang);
* no worker process alive after its launcher exited (no orphan);
* the checkpoint always parses and no run resumed from an older step than an earlier run
  (no lost checkpoint);
* either the job completed with the surviving world size, or every surviving launcher
  exited non-zero with one clear error.

The same harness drives torchrun (``launcher=TORCHRUN``) for the side-by-side table in
``benchmarks/chaos.py``. Waits are on real events (output lines, pidfds), never on sleeps;
the only sleep is a SIGSTOP's duration, which is the fault itself.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
from launcher._nodes import AELASTIC_RUN, Cluster, Node, cluster, free_port

from ._netns import Hosts

if TYPE_CHECKING:
    from _etcd_server import EtcdServer

HERE = Path(__file__).parent
WORKER = str(HERE / "chaos_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

Target = Literal["worker", "agent", "host", "link", "etcd"]
Phase = Literal["rendezvous", "startup", "training"]

#: How long a SIGSTOPped process stays stopped, or a cut link stays cut (longer than the
#: heartbeat timeout).
STOP_SECONDS = 3.0
#: The rendezvous settings every trial uses: torch's names and whole seconds, so torchrun
#: runs with exactly the same ones (a silent node is dropped after 1 s x 2 misses).
CONF = "keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=60,close_timeout=5"


@dataclass(frozen=True)
class Fault:
    """One fault: which process gets which signal in which phase of the job (``link``:
    node 2's host is cut off from the others' for :data:`STOP_SECONDS`; ``etcd``: the etcd
    server gets ``sig`` and is started again on the same data)."""

    target: Target
    sig: signal.Signals
    phase: Phase

    @property
    def name(self) -> str:
        if self.target == "link":
            return f"cut link during {self.phase}"
        return f"{self.sig.name} {self.target} during {self.phase}"

    @property
    def removes_node(self) -> bool:
        """Whether the fault takes a whole node out of the job for good."""
        return self.target in ("agent", "host") and self.sig != signal.SIGSTOP

    @property
    def must_complete(self) -> bool:
        """Whether the job must finish despite the fault (a clear failure is not enough):
        every fault but the loss of the c10d store's host leaves enough of the job."""
        return self.target != "host"

    @property
    def expected_worlds(self) -> tuple[int, ...]:
        """The world sizes a job that completes after this fault may end in."""
        if self.removes_node:
            return (2,)
        if self.target in ("link", "etcd") or (
            self.target == "agent" and self.sig == signal.SIGSTOP
        ):
            return (2, 3)  # dropped for good, or back in time to rejoin
        return (3,)


#: The faults the suite covers (``tests/chaos`` runs each once; the benchmark more often).
FAULTS: tuple[Fault, ...] = (
    Fault("worker", signal.SIGKILL, "training"),
    Fault("worker", signal.SIGTERM, "training"),
    Fault("worker", signal.SIGKILL, "startup"),
    Fault("worker", signal.SIGSTOP, "training"),
    Fault("agent", signal.SIGKILL, "rendezvous"),
    Fault("agent", signal.SIGKILL, "startup"),
    Fault("agent", signal.SIGKILL, "training"),
    Fault("agent", signal.SIGTERM, "training"),
    Fault("agent", signal.SIGSTOP, "training"),
    Fault("host", signal.SIGKILL, "training"),
    Fault("host", signal.SIGTERM, "training"),
)
#: Faults that need two test hosts (network namespaces; see ``_netns``).
HOST_FAULTS: tuple[Fault, ...] = (Fault("link", signal.SIGSTOP, "training"),)
#: Faults run with the etcd backend (a real etcd server the trial may restart).
ETCD_FAULTS: tuple[Fault, ...] = (
    Fault("etcd", signal.SIGKILL, "training"),
    Fault("agent", signal.SIGKILL, "startup"),
    Fault("agent", signal.SIGKILL, "training"),
)


@dataclass
class TrialResult:
    """What one trial saw. ``reacted_after``: fault to the survivors' old workers gone;
    ``recovered_after``: fault to a new world's workers running (seconds, or None)."""

    fault: Fault
    seed: int
    launcher: str
    codes: list[int | None]
    survivors: list[int]
    final: dict[str, int] | None
    expected_worlds: tuple[int, ...]
    orphans: list[int]
    checkpoint_problem: str | None
    unclear_errors: list[int]
    reacted_after: float | None = None
    recovered_after: float | None = None
    stderr: list[str] = field(default_factory=list)

    @property
    def hung(self) -> bool:
        return any(code is None for code in self.codes)

    @property
    def outcome(self) -> str:
        if self.hung:
            return "hung"
        if self.completed:
            return "completed"
        if not self.unclear_errors:
            return "failed, clear error"
        return "failed"

    @property
    def completed(self) -> bool:
        return (
            self.final is not None
            and self.final["world"] in self.expected_worlds
            and all(self.codes[i] == 0 for i in self.survivors)
        )

    def problems(self) -> list[str]:
        """Every property a trial must hold that this one broke (empty: it passed)."""
        out: list[str] = []
        if self.hung:
            out.append(f"launchers still running at the bound: codes={self.codes}")
        if self.orphans:
            out.append(f"orphaned worker processes: {self.orphans}")
        if self.checkpoint_problem:
            out.append(self.checkpoint_problem)
        if not self.hung and not self.completed and self.fault.must_complete:
            out.append(f"did not complete in a world of {self.expected_worlds}: {self.codes}")
        elif not self.hung and not self.completed:
            failed_all = all(self.codes[i] != 0 for i in self.survivors)
            if not failed_all:
                out.append(
                    f"neither completed in a world of {self.expected_worlds} nor failed on "
                    f"every survivor: codes={self.codes} final={self.final}"
                )
            elif self.unclear_errors:
                out.append(f"nodes {self.unclear_errors} failed without one clear error")
        if out:
            for i, err in enumerate(self.stderr):
                out.append(f"--- node{i} stderr (rc={self.codes[i]}):\n{err[-3000:]}")
        return out


def _argv(
    endpoint: str, local_addr: str, conf: str, is_host: bool, out: Path, steps: int, backend: str
) -> list[str]:
    if backend == "c10d":
        conf = f"{conf},is_host={int(is_host)}"
    return [
        "--nnodes", "2:3",
        "--nproc-per-node", "1",
        "--max-restarts", "3",
        "--rdzv-backend", backend,
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", "chaos",
        "--rdzv-conf", conf,
        "--local-addr", local_addr,
        "--monitor-interval", "0.1",
        WORKER, str(out), str(steps),
    ]  # fmt: skip


def _worker_pids(out: Path, parent: int | None = None) -> list[int]:
    """Worker pids recorded so far (``pids/<pid>-<ppid>``), optionally of one launcher."""
    pids = []
    for entry in (out / "pids").glob("*-*"):
        pid, ppid = (int(x) for x in entry.name.split("-"))
        if parent is None or ppid == parent:
            pids.append(pid)
    return sorted(pids)


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: its exit status is all that is left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def _wait_dead(pids: Sequence[int]) -> None:
    """Return once every pid has exited (pidfd readability: no polling)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if _alive(pid):
                await anyio.wait_readable(fd)
        finally:
            os.close(fd)


def _checkpoint_problem(out: Path) -> str | None:
    ckpt = out / "ckpt.json"
    if ckpt.exists():
        try:
            json.loads(ckpt.read_text())["step"]
        except (ValueError, KeyError) as exc:
            return f"the checkpoint is torn: {exc}"
    resumes_path = out / "resumes.jsonl"
    if resumes_path.exists():
        starts = [json.loads(line)["from"] for line in resumes_path.read_text().splitlines()]
        if starts != sorted(starts):
            return f"a run resumed from an older step than an earlier one: {starts}"
    return None


def _clear_error(err: str, launcher: str) -> bool:
    if launcher != "aelastic":
        return True  # torchrun's errors are what they are: the table reports its outcome
    return "aelastic run: error:" in err or "Root Cause" in err or "stopped by" in err


async def _trigger(fault: Fault, nodes: list[Node], victim: Node, rng: random.Random) -> None:
    """Wait for the phase the fault belongs to, on the job's real output, then return."""
    if fault.phase == "training":
        step = rng.randint(2, 5)
        await _any_line(nodes, lambda line: line.startswith(f"STEP {step} "))
    elif fault.phase == "startup":  # the victim's worker is up and importing torch
        await victim.wait_for_line(lambda line: line.startswith("BOOT "))


async def _any_line(nodes: Sequence[Node], predicate: Callable[[str], bool]) -> None:
    """Return when a line on any of ``nodes`` satisfies ``predicate``."""
    async with anyio.create_task_group() as tg:

        async def one(node: Node) -> None:
            await node.wait_for_line(predicate)
            tg.cancel_scope.cancel()

        for node in nodes:
            tg.start_soon(one, node)


async def run_trial(
    fault: Fault,
    seed: int,
    tmp: Path,
    *,
    launcher: Sequence[str] = AELASTIC_RUN,
    steps: int = 30,
    bound: float = 90.0,
    hosts: Hosts | None = None,
    etcd: EtcdServer | None = None,
    conf: str = CONF,
) -> TrialResult:
    """Run one seeded trial of ``fault`` and return what it saw (never raises on a
    broken property: :meth:`TrialResult.problems` lists those). A ``link`` fault needs
    ``hosts`` (nodes 0 and 1 on host a, node 2 on host b); the others run on loopback.
    With ``etcd`` the job uses the etcd backend on that server (an ``etcd`` fault needs it)."""
    rng = random.Random(seed)
    name = "aelastic" if list(launcher) == list(AELASTIC_RUN) else "torchrun"
    out = tmp / "out"
    (out / "pids").mkdir(parents=True)
    env = {"LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    # a wide last call in the rendezvous trial keeps the round open while the victim dies
    last_call = 3 if fault.phase == "rendezvous" else 1
    conf = f"{conf},last_call_timeout={last_call}"
    fault_at: float | None = None
    reacted: float | None = None
    recovered: float | None = None
    async with cluster() as c:
        start = _starter(c, launcher, env, conf, out, steps, hosts, etcd)
        nodes = [await start(True), await start(False)]
        if fault.phase == "rendezvous":
            # the host and one node join first; the third node comes after the fault
            victim_index = 0 if fault.target == "host" else 1
            with anyio.fail_after(60):
                for node in nodes:
                    await node.wait_for_err("rendezvous'ing worker group")
        else:
            fixed = {"host": 0, "link": 2, "etcd": 1}  # etcd: every node stays in
            victim_index = fixed.get(fault.target, rng.choice([1, 2]))
            nodes.append(await start(False))
        victim = nodes[victim_index]
        with anyio.move_on_after(bound):
            await _trigger(fault, nodes, victim, rng)
            others = [n for i, n in enumerate(nodes) if n is not victim or fault.target == "etcd"]
            before = {n.process.pid: _worker_pids(out, n.process.pid) for n in others}
            if fault.target == "worker":
                pids = _worker_pids(out, victim.process.pid) or _worker_pids(out)
                target_pid = rng.choice(pids)
            elif fault.target == "etcd":
                target_pid = -1
            else:
                target_pid = victim.process.pid
            fault_at = time.monotonic()
            if fault.target == "etcd":
                assert etcd is not None and etcd.proc is not None
                etcd.proc.send_signal(fault.sig)
                await anyio.to_thread.run_sync(etcd.proc.wait)
                etcd.proc = None
                await anyio.to_thread.run_sync(etcd.start)  # waits until etcd answers again
            elif fault.target == "link":
                assert hosts is not None
                hosts.cut()
                await anyio.sleep(STOP_SECONDS)  # the fault's duration, not a synchronisation
                hosts.mend()
            else:
                os.kill(target_pid, fault.sig)
            if fault.sig == signal.SIGSTOP and fault.target not in ("link", "etcd"):
                await anyio.sleep(STOP_SECONDS)  # the fault's duration, not a synchronisation
                os.kill(target_pid, signal.SIGCONT)
            if fault.phase == "rendezvous":
                nodes.append(await start(False))
            survivor_workers = [p for pids in before.values() for p in pids if p != target_pid]
            if survivor_workers:  # none yet when the fault struck in the rendezvous
                await _wait_dead(survivor_workers)
                reacted = time.monotonic() - fault_at
        with anyio.move_on_after(bound):
            for node in nodes:
                await node.wait()
        codes = [n.process.returncode for n in nodes]
        if fault_at is not None:
            ready = [
                t
                for n in nodes
                for line, t in zip(n.lines, n.line_times, strict=False)
                if t > fault_at and line.startswith("READY rank=0 ")
            ]
            recovered = min(ready) - fault_at if ready else None
            if recovered is None:  # nothing restarted: the old workers simply finished
                reacted = None
        stderr = [n.err for n in nodes]
    # the cluster block has stopped every launcher; their workers must be gone with them
    orphans = [pid for pid in _worker_pids(out) if _alive(pid)]
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    cut_off = fault.removes_node or fault.target == "link"
    survivors = [i for i in range(len(nodes)) if not (cut_off and i == victim_index)]
    final_path = out / "final.json"
    final = json.loads(final_path.read_text()) if final_path.exists() else None
    unclear = [
        i for i in survivors if codes[i] not in (0, None) and not _clear_error(stderr[i], name)
    ]
    return TrialResult(
        fault=fault,
        seed=seed,
        launcher=name,
        codes=codes,
        survivors=survivors,
        final=final,
        expected_worlds=fault.expected_worlds,
        orphans=orphans,
        checkpoint_problem=_checkpoint_problem(out),
        unclear_errors=unclear,
        reacted_after=reacted,
        recovered_after=recovered,
        stderr=stderr,
    )


def _starter(
    c: Cluster,
    launcher: Sequence[str],
    env: dict[str, str],
    conf: str,
    out: Path,
    steps: int,
    hosts: Hosts | None,
    etcd: EtcdServer | None,
) -> Callable[[bool], Awaitable[Node]]:
    """``start(is_host)``: the next node, on loopback or (with ``hosts``) node 2 on host b."""
    endpoint = f"{hosts.addresses[0] if hosts else '127.0.0.1'}:{free_port()}"
    backend = "c10d"
    if etcd is not None:
        endpoint, backend = etcd.endpoint, "etcd"

    async def start(is_host: bool) -> Node:
        if hosts is None:
            argv = _argv(endpoint, "127.0.0.1", conf, is_host, out, steps, backend)
            return await c.start(argv, env, launcher=launcher)
        host = 1 if len(c.nodes) >= 2 else 0
        argv = _argv(endpoint, hosts.addresses[host], conf, is_host, out, steps, backend)
        # gloo picks its interface by name: the veth end of this host
        node_env = {**env, "GLOO_SOCKET_IFNAME": hosts.interfaces[host]}
        return await c.start(argv, node_env, launcher=[*hosts.prefix(host), *launcher])

    return start
