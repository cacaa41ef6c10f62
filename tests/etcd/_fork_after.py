"""Use the etcd rendezvous, leave it, then fork: ``_fork_after.py ENDPOINT RUN_ID``.

Forks twice with multiprocessing's ``fork`` start method, once while the event loop
still runs and once after it ended; each child runs ``gc.collect()``. Prints
``threads <n>`` (the threads alive before each fork, idle pool threads left out) and
``child <exitcode>``, and ``child hung`` when a child does not end within 20 s (it is then killed).
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
import threading

import anyio

from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

#: Idle thread-pool threads of the event loop (a name lookup, a file read): plain Python
#: threads that a fork leaves behind safely, and that linger a while after their work.
_POOL_THREADS = ("AnyIO worker thread", "asyncio_", "ThreadPoolExecutor-")


def fork_and_collect() -> None:
    others = [t for t in threading.enumerate() if not t.name.startswith(_POOL_THREADS)]
    print(f"threads {len(others)}", flush=True)
    child = multiprocessing.get_context("fork").Process(target=gc.collect)
    child.start()
    child.join(20)
    if child.exitcode is None:
        child.kill()
        child.join()
        print("child hung", flush=True)
    else:
        print(f"child {child.exitcode}", flush=True)


async def main(endpoint: str, run_id: str) -> None:
    params = RendezvousParameters("etcd", endpoint, run_id, 1, 1, join_timeout=30)
    async with get_rendezvous_handler(params) as handler:
        await handler.next_rendezvous()
    fork_and_collect()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
    fork_and_collect()
