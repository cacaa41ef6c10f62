"""One c10d rendezvous node in its own process (used by the SIGKILL tests).

    python _node.py ENDPOINT RUN_ID MIN MAX [key=value ...]

Prints ``entered`` once connected, ``admitted RANK WORLD ROUND`` once admitted, then
``changed`` whenever the round's membership changes; runs until killed. With
``hold=1`` it waits for a line on stdin before joining; ``local_addr=A`` (default
127.0.0.1) is the address it announces.
"""

from __future__ import annotations

import sys

import anyio

from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler


async def main(argv: list[str]) -> None:
    endpoint, run_id, min_nodes, max_nodes, *conf = argv
    config = dict(item.split("=", 1) for item in conf)
    hold = config.pop("hold", "0") == "1"
    local_addr = config.pop("local_addr", "127.0.0.1")
    params = RendezvousParameters(
        "c10d", endpoint, run_id, int(min_nodes), int(max_nodes), local_addr=local_addr, **config
    )
    async with get_rendezvous_handler(params) as handler:
        print("entered", flush=True)
        if hold:
            await anyio.wrap_file(sys.stdin).readline()
        while True:
            info = await handler.next_rendezvous()
            print("admitted", info.rank, info.world_size, info.round, flush=True)
            await handler.wait_for_membership_change()
            print("changed", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
