"""Many c10d rendezvous nodes in one process, driven line by line on stdin.

    python _node_pool.py ENDPOINT MIN MAX [key=value ...]

Each node is a handler of its own (its own store connection, its own keep-alive) in a
task of its own; starting a node costs no interpreter, so a test that needs a fresh peer
for each of many runs (``test_cancel_points``) starts one process for all of them.
Commands (one per line; NAME is the test's name for the node):

* ``enter NAME RUN_ID``: enter a handler for ``RUN_ID``; prints ``NAME entered``.
* ``join NAME``: join, print ``NAME admitted RANK WORLD ROUND`` once admitted, then
  ``NAME changed`` whenever the round's membership changes, and join again.
* ``close NAME``: leave the rendezvous and exit the handler; prints ``NAME closed``.

Like ``_node.py`` (a node per process), it runs until killed or until stdin closes.
"""

from __future__ import annotations

import sys

import anyio
from anyio.abc import TaskStatus

from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler


def say(*words: object) -> None:
    print(*words, flush=True)


async def main(argv: list[str]) -> None:
    endpoint, min_nodes, max_nodes, *conf = argv
    config = dict(item.split("=", 1) for item in conf)
    local_addr = config.pop("local_addr", "127.0.0.1")
    joins: dict[str, anyio.Event] = {}
    scopes: dict[str, anyio.CancelScope] = {}

    async def node(
        name: str, run_id: str, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        params = RendezvousParameters(
            "c10d", endpoint, run_id, int(min_nodes), int(max_nodes), local_addr=local_addr,
            **config,
        )  # fmt: skip
        with anyio.CancelScope() as scopes[name]:
            async with get_rendezvous_handler(params) as handler:
                say(name, "entered")
                task_status.started()
                await joins[name].wait()
                while True:
                    info = await handler.next_rendezvous()
                    say(name, "admitted", info.rank, info.world_size, info.round)
                    await handler.wait_for_membership_change()
                    say(name, "changed")
        say(name, "closed")

    async with anyio.create_task_group() as tg:
        async for line in anyio.wrap_file(sys.stdin):
            command, name, *rest = line.split()
            if command == "enter":
                joins[name] = anyio.Event()
                await tg.start(node, name, rest[0])
            elif command == "join":
                joins[name].set()
            elif command == "close":
                scopes.pop(name).cancel()
            else:
                raise SystemExit(f"unknown command {line!r}")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
