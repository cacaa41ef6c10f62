"""Many nodes, no ``--lighthouse``: the node that hosts the store starts the Lighthouse.

With ``--replica-group-id K`` and the c10d backend, every group's nodes give the same
``--rdzv-endpoint`` (the groups' rendezvous stay apart: each has its own run id). The
runner on the node that can host that store (``--rdzv-conf is_host=1``, or the
endpoint names this machine; and its port is free) hosts it *before* its group
starts (the group's rendezvous then finds it taken and connects as a client),
starts the Lighthouse there and writes its URL into the store; every other node's
runner connects to the store and reads the URL, then starts its group. At the end
each runner notes its group done; the hosting runner keeps the store and the
Lighthouse until every group is done (at most ``exit_barrier_timeout``), so a group
that finishes first does not take the Lighthouse from the others.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress

import anyio

from .._tasks import background_tasks
from ..rendezvous import RendezvousParameters
from ..rendezvous._c10d import is_local_address
from ..rendezvous._params import DEFAULT_C10D_PORT, parse_endpoint
from ..replicas import LighthouseError
from ..replicas._lighthouse import Lighthouse, open_lighthouse
from ..replicas._settings import LighthouseSettings
from ..store import Store, StoreError, StoreServer, TCPStoreClient
from ._config import LaunchConfig

__all__ = ("shared_lighthouse",)

log = logging.getLogger("aelastic.replicas")

#: seconds a runner waits for the store's host (when the config sets no join timeout)
DEFAULT_MEET_TIMEOUT = 600.0
#: seconds of that wait before the runner says what it waits for
WAIT_NOTICE = 30.0


def _prefix(run_id: str) -> str:
    return f"aelastic/replicas/{run_id}"


def _bind(host: str) -> str:
    """The address a server for endpoint host ``host`` binds (as the c10d handler)."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "localhost" if host == "localhost" else "0.0.0.0"
    return host


async def _say_still_waiting(group_id: int, host: str, port: int, within: float) -> None:
    """After ``WAIT_NOTICE`` seconds (half of ``within`` if shorter), say on stderr what
    this runner waits for: a node that waits for a store nobody hosts would otherwise
    wait ``within`` s in silence."""
    await anyio.sleep(min(WAIT_NOTICE, within / 2))
    log.warning(
        "replica group %d: still waiting for the store at %s:%s to give the Lighthouse's URL"
        " (up to %g s). Start the node that hosts it; if %s is not this machine's name,"
        " give that node --rdzv-conf is_host=1; or give every node --lighthouse"
        " http://HOST:PORT",
        group_id,
        host,
        port,
        within,
        host,
    )


@asynccontextmanager
async def shared_lighthouse(
    config: LaunchConfig, group_id: int, groups: int, settings: LighthouseSettings
) -> AsyncIterator[tuple[str, Lighthouse | None]]:
    """Yield ``(Lighthouse URL, the Lighthouse if this node runs it)`` for a many-node
    replica-group job of ``groups`` groups, this node in ``group_id``.

    Cancellation and errors in the block leave at once (the hosting runner does not
    wait for the others then); a normal exit notes the group done and, on the host,
    waits for the other groups (bounded by ``config.exit_barrier_timeout``).

    Raises:
        LighthouseError: the store at ``config.rdzv_endpoint`` cannot be reached, or no
            Lighthouse URL appears there within the rendezvous join timeout.
    """
    host, port = parse_endpoint(config.rdzv_endpoint, DEFAULT_C10D_PORT)
    prefix = _prefix(config.run_id)
    within = float(
        config.rdzv_configs.get("join_timeout")
        or config.rdzv_configs.get("timeout")
        or DEFAULT_MEET_TIMEOUT
    )
    async with AsyncExitStack() as stack:
        store: Store | None = None
        lighthouse: Lighthouse | None = None
        params = RendezvousParameters("c10d", config.rdzv_endpoint, config.run_id, 1, 1)
        params.config.update(config.rdzv_configs)
        is_host = params.get_as_bool("is_host")  # as the c10d handler decides
        if is_host is None:  # the resolver may block: off the loop
            is_host = await anyio.to_thread.run_sync(is_local_address, host)
        if is_host:
            server = StoreServer(_bind(host), port, allow_non_loopback=True)
            try:
                await stack.enter_async_context(server)
            except StoreError as exc:  # another node (or runner) hosts it
                log.info("not hosting the store at %s:%s (%s)", host, port, exc)
            else:
                store = server.local_store
                bind = _bind(host)
                lighthouse = await stack.enter_async_context(
                    open_lighthouse(dataclasses.replace(settings, host=bind, advertise=host))
                )
                await store.set(f"{prefix}/lighthouse", lighthouse.url)
                log.info(
                    "hosting the store at %s:%s and the Lighthouse at %s",
                    host,
                    port,
                    lighthouse.url,
                )
        if store is None:
            client = TCPStoreClient(host, port, timeout=within, connect_timeout=within)
            try:
                async with background_tasks() as tg:
                    tg.start_soon(_say_still_waiting, group_id, host, port, within)
                    await stack.enter_async_context(client)
                    url = (await client.get(f"{prefix}/lighthouse", timeout=within)).decode()
            except (StoreError, OSError, TimeoutError) as exc:
                raise LighthouseError(
                    f"replica group {group_id}: no Lighthouse URL from the store at "
                    f"{host}:{port} within {within:g} s ({exc}); start the node that hosts "
                    "it, or give every node --lighthouse http://HOST:PORT"
                ) from None
            try:
                yield url, None
            finally:
                # (the host waits for it at most exit_barrier_timeout)
                shield = anyio.CancelScope(shield=True)
                with shield, anyio.move_on_after(5.0), suppress(StoreError, OSError):
                    await client.set(f"{prefix}/done/{group_id}", b"1")
            return
        assert lighthouse is not None
        yield lighthouse.url, lighthouse
        others = [f"{prefix}/done/{k}" for k in range(groups) if k != group_id]
        if others:
            with anyio.move_on_after(config.exit_barrier_timeout):
                with suppress(StoreError, TimeoutError):
                    await store.wait(others, timeout=config.exit_barrier_timeout)
