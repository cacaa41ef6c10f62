"""The agent enters a rendezvous handler nobody entered (issue 11, item 4)."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio

from aelastic.agent import LocalElasticAgent, WorkerState
from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aelastic.rendezvous._c10d import C10dRendezvousHandler

from .conftest import local_spec


def refuses(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` any more."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_agent_enters_a_handler_nobody_entered(tmp_path: Path) -> None:
    params = RendezvousParameters(
        "c10d", "127.0.0.1:0", "job", 1, 1, local_addr="127.0.0.1", keep_alive_interval="0.2"
    )
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, C10dRendezvousHandler)
    spec = local_spec(handler, ("-c", "pass"), tmp_path)  # type: ignore[arg-type]
    agent = LocalElasticAgent(spec, start_method="spawn")
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state == WorkerState.SUCCEEDED
    assert not handler.started  # the agent left what it entered
    assert handler.server is not None and refuses(handler.server.port)
