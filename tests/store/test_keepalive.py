"""Client connections carry TCP keepalive and a user timeout: a peer that vanishes
without closing (powered off, cut off) fails the connection in seconds, not hours."""

from __future__ import annotations

import socket

from aelastic.store import StoreServer
from aelastic.store._client_conn import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    USER_TIMEOUT_MS,
    connect_socket,
)


async def test_client_sockets_have_keepalive_and_a_user_timeout(
    store_server: StoreServer,
) -> None:
    sock = await connect_socket("127.0.0.1", store_server.port)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        tcp = socket.IPPROTO_TCP
        assert sock.getsockopt(tcp, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
        assert sock.getsockopt(tcp, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL
        assert sock.getsockopt(tcp, socket.TCP_KEEPCNT) == KEEPALIVE_COUNT
        assert sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT) == USER_TIMEOUT_MS
