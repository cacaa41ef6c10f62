"""The etcd backend is asyncio-only: on trio it says so before any I/O (issue 11)."""

from __future__ import annotations

import socket

import anyio
import pytest

from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aelastic.rendezvous._exceptions import RendezvousUnsupportedLoopError


@pytest.mark.parametrize("call", ["enter", "next_rendezvous"])
def test_etcd_on_trio_refuses_before_any_io(call: str) -> None:
    with socket.socket() as listener:  # stands in for etcd: must see no connection
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        handler = get_rendezvous_handler(
            RendezvousParameters("etcd", f"127.0.0.1:{port}", "job", 1, 1)
        )

        async def main() -> None:
            if call == "enter":
                async with handler:
                    pass
            else:
                await handler.next_rendezvous()

        with pytest.raises(
            RendezvousUnsupportedLoopError, match=r"only on asyncio.*trio.*--rdzv-backend c10d"
        ):
            anyio.run(main, backend="trio")
        with pytest.raises(BlockingIOError):
            listener.accept()
