"""One etcd rendezvous node in its own process: ``_node.py ENDPOINT RUN_ID MIN MAX``.

Prints ``rank <r> world <w>`` once admitted, then waits to be killed.
"""

from __future__ import annotations

import sys

import anyio

from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler


async def main(endpoint: str, run_id: str, lo: int, hi: int) -> None:
    params = RendezvousParameters(
        "etcd",
        endpoint,
        run_id,
        lo,
        hi,
        keep_alive_interval=0.5,
        keep_alive_max_attempt=2,
        last_call_timeout=0.3,
        join_timeout=30,
    )
    async with get_rendezvous_handler(params) as handler:
        info = await handler.next_rendezvous()
        print(f"rank {info.rank} world {info.world_size}", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
