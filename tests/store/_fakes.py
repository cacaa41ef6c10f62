"""A socket stand-in to drive a server connection's synchronous core without I/O."""

from __future__ import annotations

from aelastic.store import StoreServer
from aelastic.store import _protocol as P
from aelastic.store._server_conn import _Connection


class FakeSocket:
    """Records what the connection sends; ``send`` always takes everything."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.writes = 0
        self.closed = False

    def send(self, data: bytes) -> int:
        self.out += data
        self.writes += 1
        return len(data)

    def close(self) -> None:
        self.closed = True

    def fileno(self) -> int:
        return -1


def connection(server: StoreServer, *, validate: bool = True) -> tuple[_Connection, FakeSocket]:
    """A connection of ``server`` on a fake socket (VALIDATE already received)."""
    sock = FakeSocket()
    conn = _Connection(server._hub, sock, "test")  # type: ignore[arg-type]
    if validate:
        assert conn.data_received(P.request_validate()) == []
    return conn, sock
