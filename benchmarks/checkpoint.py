"""Checkpoint save/load: aelastic.checkpoint vs torch.save / torch.load vs DCP async_save.

    python benchmarks/checkpoint.py [--sizes-mib 128,1024] [--repeats 3]
        [--mode all|peer|floor|stall] [--tensors 8]

One process plays one rank (RANK=0, WORLD_SIZE=1) of a state of N MiB (``--tensors``
float32 tensors, 8 by default: a model-like state_dict) and measures, side by side in one run:

* **save, blocking**: ``aelastic.checkpoint.save`` into an agent-style directory in
  ``/dev/shm`` (steady state: after two saves, as in training, so it reuses the pages
  of the step it drops), its first and second save of a run after
  ``checkpoint.reserve(state)`` (what a resumed worker gets from ``load()``) and the
  first one without (a fresh directory), ``dcp.save`` with ``MemoryWriter``, against
  the **copy floor** (the same tensors' bytes copied into a mapping of a ``/dev/shm``
  file whose pages are allocated and mapped already: one ``memcpy``), ``torch.save``
  to a local file (the disk's page cache, no fsync, what most scripts do) and
  ``torch.distributed.checkpoint.async_save`` (gloo, world 1): the time until each
  call returns. DCP's background write is awaited before the next round.
* **load after a restart**: a fresh interpreter (torch imported first, not timed)
  runs ``aelastic.checkpoint.load()`` with the environment the agent gives a restarted
  worker, vs ``torch.load`` of the local file, then copies both into preallocated
  parameters (``load_state_dict``-like).
* **persist**: the agent's background copy of the newest step to a disk directory
  (``Checkpoints.persist``: one thread, sendfile, fsync) vs the largest event-loop
  stall a 1 ms ticker sees meanwhile.
* **peer copy** (``--mode peer`` runs only this): the agent's copy of a rank's newest
  step to the next node's agent (``--checkpoint-peer-copies``; ``_peer_copies``: ``sendfile``
  from the file in ``/dev/shm`` to a loopback socket, ``recv_into`` a mapping of the
  destination file), steady state (each push a newer step, the peer keeping
  two: the median of the pushes from the third on, which reuse the pages of the step
  they replace) and the first push (new pages), and a replacement node's fetch of it
  (into an empty directory: new pages), vs raw loopback TCP
  (the same bytes from memory to a receiver that drops them, anyio streams, same
  chunks): the ceiling. Both ends run in this process's event loop in every case,
  with the largest stall a 1 ms ticker sees meanwhile.

* **stall** (``--mode stall`` runs only this): a save buffer prepared in a thread (as
  after a save) while the main thread spins like a training loop: the preparation's
  time and the main thread's longest stall, page tables filled by ``mmap.madvise``
  (which holds the GIL) and by ``_buffer.map_file`` (ctypes, which drops it).
* **floor** (``--mode floor`` runs only this): per size, ``--repeats`` interleaved
  rounds of the copy floor, a steady-state save and ``torch.save`` to a ``/dev/shm``
  file (torch's defaults: CRC-32 on), then ``--repeats`` runs' first and
  second saves after ``reserve()`` (a fresh directory each); min and median of each (on
  a shared machine the minimum is the closest to the uncontended cost, and
  interleaving gives both the same load).

Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import mmap
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

import anyio
import anyio.abc
import torch
from anyio.abc import SocketAttribute

from aelastic import checkpoint
from aelastic.checkpoint import _buffer
from aelastic.checkpoint import _layout as L
from aelastic.checkpoint._agent import Checkpoints
from aelastic.checkpoint._peer_copies import PeerRound, open_peer_copies
from aelastic.store import LocalStore

#: What raw loopback TCP sends at a time (anyio streams; the agent's 1 MiB before it
#: sent with sendfile).
CHUNK = 1 << 20

LOAD = """\
import os, sys, time, torch
from aelastic import checkpoint
size, path = int(sys.argv[1]), sys.argv[2]
params = {f"w{i}": torch.zeros(size // 8) for i in range(8)}  # pages touched
torch.load(path, weights_only=False)  # torch.load's first-call costs, paid by neither
t0 = time.perf_counter(); step, obj = checkpoint.load(); t1 = time.perf_counter()
for k, v in obj.items(): params[k].copy_(v)
t2 = time.perf_counter()
ref = torch.load(path, weights_only=False); t3 = time.perf_counter()
for k, v in ref.items(): params[k].copy_(v)
t4 = time.perf_counter()
print(t1 - t0, t2 - t0, t3 - t2, t4 - t2)
"""


_steps = itertools.count()


#: Tensors per state (``--tensors``).
_tensors = 8


def state(mib: int) -> dict[str, torch.Tensor]:
    n = mib * (1 << 20) // 4
    return {f"w{i}": torch.randn(n // _tensors) for i in range(_tensors)}


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def dcp_group() -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)


def copy_floor(sd: dict[str, torch.Tensor], directory: str) -> float:
    """Seconds to copy ``sd``'s bytes into a ``/dev/shm`` file's mapping, pages ready."""
    size = sum(t.numel() * t.element_size() for t in sd.values())
    path = os.path.join(directory, "floor")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, size)
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    os.close(fd)

    def copy() -> None:
        offset = 0
        for t in sd.values():
            view = t.numpy().data.cast("B")
            mm[offset : offset + view.nbytes] = view
            offset += view.nbytes

    took = timed(copy)
    mm.close()
    os.unlink(path)
    return took


def first_save(sd: dict[str, torch.Tensor], memory: str, prepared: bool) -> tuple[float, float]:
    """Seconds of the first and second save into a fresh directory (``prepared``: after
    ``checkpoint.reserve(sd)`` finished)."""
    fresh = tempfile.mkdtemp(prefix="ckpt_bench_first_", dir=os.path.dirname(memory))
    os.environ[L.DIR_ENV] = fresh
    try:
        if prepared:
            checkpoint.reserve(sd)
            checkpoint.wait()
        first = timed(lambda: checkpoint.save(sd, step=next(_steps)))
        checkpoint.wait()  # what a training step leaves the background preparation
        second = timed(lambda: checkpoint.save(sd, step=next(_steps)))
        checkpoint.wait()
    finally:
        os.environ[L.DIR_ENV] = memory
        shutil.rmtree(fresh, ignore_errors=True)
        _buffer.forget_others(fresh, 0)
    return first, second


def floor_pairs(mib: int, repeats: int, memory: str) -> dict[str, float]:
    """Interleaved copy floors and steady-state saves, then the first two saves of a
    run after reserve() (a fresh directory each; after the steady saves, as a save
    process unmaps the buffers of any other directory)."""
    sd = state(mib)
    os.environ.update({L.DIR_ENV: memory, "RANK": "0", "WORLD_SIZE": "1"})
    checkpoint.save(sd, step=next(_steps))
    checkpoint.save(sd, step=next(_steps))
    floor, ours, firsts, seconds, plain = [], [], [], [], []
    plain_path = os.path.join(memory, "torch_save.pt")
    for _ in range(repeats):
        floor.append(copy_floor(sd, memory))
        checkpoint.wait()
        ours.append(timed(functools.partial(checkpoint.save, sd, step=next(_steps))))
        plain.append(timed(functools.partial(torch.save, sd, plain_path)))
        os.unlink(plain_path)
    checkpoint.wait()
    for _ in range(repeats):
        first, second = first_save(sd, memory, prepared=True)
        firsts.append(first)
        seconds.append(second)
    return {
        "floor": statistics.median(floor),
        "floor_min": min(floor),
        "save": statistics.median(ours),
        "save_min": min(ours),
        "first": statistics.median(firsts),
        "second": statistics.median(seconds),
        "torch_save": statistics.median(plain),
    }


def bench_size(mib: int, repeats: int, scratch: str, memory: str) -> dict[str, float]:
    import torch.distributed.checkpoint.state_dict_saver as dcp

    sd = state(mib)
    os.environ.update({L.DIR_ENV: memory, "RANK": "0", "WORLD_SIZE": "1"})
    local = os.path.join(scratch, "torch_save.pt")
    ours, floor, dcp_memory, torch_save, dcp_async = [], [], [], [], []
    # steps continue across sizes: one process, one rank, steps never go back
    cold, _ = first_save(sd, memory, prepared=False)
    first, second = first_save(sd, memory, prepared=True)
    checkpoint.save(sd, step=next(_steps))
    checkpoint.save(sd, step=next(_steps))
    for r in range(repeats):
        floor.append(copy_floor(sd, memory))
        checkpoint.wait()  # the background preparation, if any (none in the steady state)
        newest = next(_steps)
        ours.append(timed(functools.partial(checkpoint.save, sd, step=newest)))
        writer = checkpoint.MemoryWriter(step=next(_steps))
        dcp_memory.append(timed(functools.partial(dcp.save, sd, storage_writer=writer)))
        torch_save.append(timed(lambda: torch.save(sd, local)))
        target = os.path.join(scratch, f"dcp_{r}")
        start = time.perf_counter()
        future = dcp.async_save(sd, checkpoint_id=target)
        dcp_async.append(time.perf_counter() - start)
        assert isinstance(future, Future)
        future.result()
        shutil.rmtree(target, ignore_errors=True)
    newest = next(_steps)
    checkpoint.save(sd, step=newest)  # load() reads a plain save's step
    env = {**os.environ, L.STEP_ENV: str(newest), L.WORLD_ENV: "1"}
    loads = [
        [
            float(x)
            for x in subprocess.check_output(
                [sys.executable, "-c", LOAD, str(mib * (1 << 20) // 4), local], env=env, text=True
            ).split()
        ]
        for _ in range(repeats)
    ]
    stall, persist = anyio.run(persist_stall, memory, os.path.join(scratch, "disk"))
    _buffer.forget_others(memory, -1)  # the pages go with the directory
    return {
        "copy_floor": statistics.median(floor),
        "save_first_unprepared": cold,
        "save_first": first,
        "save_second": second,
        "dcp_memory_writer": statistics.median(dcp_memory),
        "save": statistics.median(ours),
        "torch_save": statistics.median(torch_save),
        "dcp_async_save": statistics.median(dcp_async),
        "load": statistics.median(x[0] for x in loads),
        "load_copy": statistics.median(x[1] for x in loads),
        "torch_load": statistics.median(x[2] for x in loads),
        "torch_load_copy": statistics.median(x[3] for x in loads),
        "persist": persist,
        "persist_loop_stall": stall,
    }


async def persist_stall(memory: str, disk: str) -> tuple[float, float]:
    """(largest 1 ms-ticker lateness, seconds) while the agent copies the newest step."""
    cp = Checkpoints(memory, disk, lambda name, md: None)
    cp.local_ranks = (0,)
    stall = await ticked(cp.persist)
    assert cp.persisted_step is not None
    return stall


async def ticked(fn: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(largest 1 ms-ticker lateness, seconds) while ``fn()`` runs."""
    worst = 0.0
    done = anyio.Event()

    async def tick() -> None:
        nonlocal worst
        while not done.is_set():
            start = time.perf_counter()
            await anyio.sleep(0.001)
            worst = max(worst, time.perf_counter() - start - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        start = time.perf_counter()
        await fn()
        took = time.perf_counter() - start
        done.set()
    return worst, took


def size_of(path: str) -> int:
    return os.path.getsize(path)


def fill(path: str, size: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)


def advance(root: str, step: int) -> None:
    """Node a's rank file moves on from ``step - 1`` to ``step`` (the same bytes: what
    is copied does not matter here, only that each push is of a newer step)."""
    os.makedirs(L.step_dir(root, step), exist_ok=True)
    os.rename(L.rank_file(root, step - 1, 0, 2), L.rank_file(root, step, 0, 2))
    L.remove_if_done(L.step_dir(root, step - 1))


async def peer_copy(mib: int, repeats: int) -> dict[str, float]:
    """Seconds and loop stalls of pushes, fetches and raw loopback TCP of ``mib`` MiB."""
    size = mib << 20
    dirs = [tempfile.mkdtemp(prefix="ckpt_peer_", dir="/dev/shm") for _ in range(3)]
    a, b, c = dirs
    fill(L.rank_file(a, 1, 0, 2), size)
    # node b's own rank, saved: a node takes peer copies once it holds a step of its own
    # (of sizes up to 4x its own, issue 37); the code before took them regardless
    fill(L.rank_file(b, 1, 1, 2), size)
    store = LocalStore()
    rounds = [PeerRound(store, g, 2, (g,), "127.0.0.1", "127.0.0.1") for g in (0, 1)]
    push, fetch, raw = [], [], []
    try:
        # no background copies: only the ones timed here
        async with open_peer_copies(a, 1, 3600) as ra, open_peer_copies(b, 1, 3600) as rb:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ra.join, rounds[0])
                tg.start_soon(rb.join, rounds[1])
            ra.started(rounds[0])
            # a newer step each time, as in training: b keeps two, so from the third
            # push on each lands in the pages of the step it replaces
            for step in range(1, repeats + 3):
                if step > 1:
                    advance(a, step)
                push.append(await ticked(ra.push))
                assert size_of(L.rank_file(b, step, 0, 2)) == size
            await anyio.to_thread.run_sync(shutil.rmtree, a)  # node a is lost
            L.prune(b, [0], keep=1)  # one step to fetch (a replacement fetches all held)
            for _ in range(repeats):
                await anyio.to_thread.run_sync(shutil.rmtree, c, True)
                os.mkdir(c)
                store = LocalStore()  # a new round: b announces what it holds now
                again = [PeerRound(store, g, 2, (g,), "127.0.0.1", "127.0.0.1") for g in (0, 1)]
                async with open_peer_copies(c, 1, 3600) as rc:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(rb.join, again[1])
                        tg.start_soon(rc.join, again[0])
                    step = repeats + 2  # what a round's agreement has c fetch (_agent)
                    fetch.append(
                        await ticked(functools.partial(rc.fetch, again[0], 1, step, 2, [0]))
                    )
                assert size_of(L.rank_file(c, repeats + 2, 0, 2)) == size
        for _ in range(repeats):
            raw.append(await ticked(lambda: raw_tcp(size)))
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return {
        "push_first": push[0][1],
        "push": statistics.median(t for _, t in push[2:]),
        "push_stall": max(w for w, _ in push),
        "fetch": statistics.median(t for _, t in fetch),
        "fetch_stall": max(w for w, _ in fetch),
        "raw_tcp": statistics.median(t for _, t in raw),
        "raw_tcp_stall": max(w for w, _ in raw),
    }


async def raw_tcp(size: int) -> None:
    """``size`` bytes from memory over loopback to a receiver that drops them."""
    chunk = b"\x01" * CHUNK
    got = 0
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(SocketAttribute.local_port)

    async def receive(stream: anyio.abc.SocketStream) -> None:
        nonlocal got
        async with stream:
            async for data in stream:
                got += len(data)
        tg.cancel_scope.cancel()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, receive)
        async with await anyio.connect_tcp("127.0.0.1", port) as client:
            for offset in range(0, size, CHUNK):
                await client.send(chunk[: min(CHUNK, size - offset)])
    assert got == size, (got, size)


def prepare_stall(mib: int) -> dict[str, tuple[float, float]]:
    """A save buffer of ``mib`` MiB prepared in a thread (as after a save) while the main
    thread spins as a training loop would: how long the preparation took and the longest
    the main thread went without running, with the page tables filled by
    ``mmap.madvise`` (holds the GIL) and by ``_buffer.map_file`` (ctypes: drops it)."""
    size = mib << 20
    directory = tempfile.mkdtemp(prefix="ckpt_bench_stall_", dir="/dev/shm")

    def by_madvise(fd: int) -> mmap.mmap:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        mm.madvise(23, 0, size)  # MADV_POPULATE_WRITE
        return mm

    def by_map_file(fd: int) -> mmap.mmap:
        return _buffer.map_file(fd, size, size)

    out = {}
    try:
        for name, populate in (("mmap.madvise", by_madvise), ("map_file", by_map_file)):
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.posix_fallocate(fd, 0, size)
            took: list[float] = []

            def prepare(
                fd: int = fd,
                populate: Callable[[int], mmap.mmap] = populate,
                took: list[float] = took,
            ) -> None:
                start = time.perf_counter()
                populate(fd).close()
                took.append(time.perf_counter() - start)

            worker = threading.Thread(target=prepare)
            gap, last = 0.0, time.perf_counter()
            worker.start()
            while worker.is_alive():
                now = time.perf_counter()
                gap, last = max(gap, now - last), now
            worker.join()
            os.close(fd)
            os.unlink(path)
            out[name] = (took[0], gap)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="128,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scratch", default=None, help="local directory for torch.save/DCP")
    parser.add_argument("--mode", choices=("all", "peer", "floor", "stall"), default="all")
    parser.add_argument("--tensors", type=int, default=8, help="tensors per state")
    opts = parser.parse_args()
    global _tensors
    _tensors = opts.tensors
    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}", flush=True)
    results: dict[str, dict[int, dict[str, float]]] = {"save_load": {}, "peer": {}}
    sizes = [int(x) for x in opts.sizes_mib.split(",")]
    if opts.mode == "stall":
        for mib in sizes:
            for name, (took, gap) in prepare_stall(mib).items():
                print(
                    f"{mib} MiB prepared in the background, page tables filled by {name}:"
                    f" {took * 1e3:.1f} ms; the training thread's longest stall {gap * 1e3:.1f} ms",
                    flush=True,
                )
        return
    if opts.mode == "floor":
        for mib in sizes:
            memory = tempfile.mkdtemp(prefix="ckpt_bench_", dir="/dev/shm")
            try:
                f = floor_pairs(mib, opts.repeats, memory)
            finally:
                shutil.rmtree(memory, ignore_errors=True)
                _buffer.forget_others(memory, -1)
            print(
                f"{mib} MiB: save min {f['save_min'] * 1e3:.1f} ms / floor min"
                f" {f['floor_min'] * 1e3:.1f} ms = {f['save_min'] / f['floor_min']:.2f}x;"
                f" medians {f['save'] * 1e3:.1f} / {f['floor'] * 1e3:.1f} ms ="
                f" {f['save'] / f['floor']:.2f}x; first save of a run after reserve()"
                f" {f['first'] * 1e3:.1f} ms ({f['first'] / f['floor']:.2f}x the floor's"
                f" median), second {f['second'] * 1e3:.1f} ms ({f['second'] / f['floor']:.2f}x);"
                f" torch.save to /dev/shm {f['torch_save'] * 1e3:.1f} ms"
                f" ({f['torch_save'] / f['floor']:.2f}x)",
                flush=True,
            )
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    # as `aelastic run` does after start-up: its agent holds no torch, this process does,
    # and a full collection of torch's objects stalled the loop 70-90 ms mid-fetch
    gc.freeze()
    for mib in sizes:
        p = anyio.run(peer_copy, mib, opts.repeats)
        results["peer"][mib] = p
        rate = {k: f"{mib / p[k]:.0f} MiB/s" for k in ("push", "fetch", "raw_tcp")}
        print(f"\n{mib} MiB, peer copy on loopback (median of {opts.repeats})")
        print(
            f"  push to the next node {p['push'] * 1e3:.0f} ms ({rate['push']}; the first,"
            f" into new pages, {p['push_first'] * 1e3:.0f} ms),"
            f" fetch by a replacement {p['fetch'] * 1e3:.0f} ms ({rate['fetch']})"
            f" | raw loopback TCP {p['raw_tcp'] * 1e3:.0f} ms ({rate['raw_tcp']})"
            f" -> push {p['raw_tcp'] / p['push']:.2f}x, fetch {p['raw_tcp'] / p['fetch']:.2f}x"
            f" raw TCP's throughput; largest loop stall: push {p['push_stall'] * 1e3:.1f} ms,"
            f" fetch {p['fetch_stall'] * 1e3:.1f} ms, raw {p['raw_tcp_stall'] * 1e3:.1f} ms"
        )
    if opts.mode == "peer":
        print(f"\nload average {os.getloadavg()[0]:.2f}")
        print(json.dumps(results))
        return
    dcp_group()
    for mib in sizes:
        scratch = tempfile.mkdtemp(prefix="ckpt_bench_", dir=opts.scratch or "/var/tmp")
        memory = tempfile.mkdtemp(prefix="ckpt_bench_", dir="/dev/shm")
        try:
            r = bench_size(mib, opts.repeats, scratch, memory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(memory, ignore_errors=True)
        results["save_load"][mib] = r
        print(f"\n{mib} MiB per rank (median of {opts.repeats})")
        ms = {k: f"{v * 1e3:.1f} ms" for k, v in r.items()}
        floor = r["copy_floor"]
        print(
            f"  save blocking: aelastic {ms['save']} ({r['save'] / floor:.2f}x the copy floor"
            f" {ms['copy_floor']}); first save after reserve() {ms['save_first']}"
            f" ({r['save_first'] / floor:.2f}x), second {ms['save_second']}"
            f" ({r['save_second'] / floor:.2f}x), first without reserve()"
            f" {ms['save_first_unprepared']} ({r['save_first_unprepared'] / floor:.2f}x)"
        )
        print(
            f"  dcp.save(MemoryWriter) {ms['dcp_memory_writer']}"
            f" ({r['dcp_memory_writer'] / floor:.2f}x the floor)"
            f" | torch.save {ms['torch_save']} | DCP async_save {ms['dcp_async_save']}"
            f" -> aelastic {r['save'] / r['torch_save']:.3f}x torch.save,"
            f" {r['save'] / r['dcp_async_save']:.2f}x async_save"
        )
        print(
            f"  load after restart: aelastic {ms['load']} (+copy into params {ms['load_copy']})"
            f" | torch.load {ms['torch_load']} (+copy {ms['torch_load_copy']})"
            f" -> {r['load'] / r['torch_load']:.2f}x"
        )
        print(
            f"  persist to disk (background): {ms['persist']},"
            f" largest loop stall meanwhile {r['persist_loop_stall'] * 1e3:.1f} ms"
        )
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    print(json.dumps(results))
    os._exit(0)  # skip finalization with a gloo group up


if __name__ == "__main__":
    main()
