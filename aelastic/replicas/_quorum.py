"""The quorum's membership: read from the Lighthouse's status page, followed over time.

torchft 0.2.0's Lighthouse has no JSON API; its dashboard's ``GET /status`` is an
HTML fragment naming the last quorum (id, each member's replica id, step and world
size) and every heartbeating replica with how long ago it was seen.
:func:`parse_status_page` reads that (plain, no I/O; a page it does not recognise
gives an empty quorum, never an error), :func:`read_quorum` fetches it, and
:class:`QuorumHistory` keeps the moments the membership changed (bounded).
"""

from __future__ import annotations

import html
import re
from collections import deque
from typing import Any

import anyio

from ._exceptions import LighthouseError
from ._settings import parse_lighthouse_url

__all__ = ("QuorumHistory", "member_group", "parse_status_page", "read_quorum")

_QUORUM_ID = re.compile(r"Previous quorum id:\s*(\d+)")
_MEMBER = re.compile(
    r'<div class="member[^"]*">\s*<b>([^<]*)</b>.*?Step:\s*(-?\d+).*?World size:\s*(\d+)', re.S
)
_HEARTBEAT = re.compile(
    r'<li class="heartbeat([^"]*)">\s*([^<]*?): seen ([0-9.]+)\s*(ns|µs|us|ms|s)\s+ago', re.S
)
_UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
#: longest page read (a quorum of a few thousand replicas)
_MAX_PAGE = 4 << 20


def member_group(replica_id: str) -> int | None:
    """The replica group of a quorum member, by torchft's own convention (what its
    Manager shards data by): the trailing digits of the id it was given, before the
    ``:<uuid>`` the Manager appends (``train_ddp_3:1f0c...`` is group 3); None when the
    id has no trailing digits."""
    given = replica_id.split(":", 1)[0]
    digits = len(given) - len(given.rstrip("0123456789"))
    return int(given[-digits:]) if digits else None


def parse_status_page(page: str) -> dict[str, Any]:
    """``{"quorum_id", "members": [{"replica_id", "step", "world_size"}], "heartbeats":
    [{"replica_id", "seen_s", "old"}]}`` of the Lighthouse's ``/status`` fragment
    (``quorum_id`` None and no members before the first quorum)."""
    found = _QUORUM_ID.search(page)
    members = [
        {"replica_id": html.unescape(m[1]).strip(), "step": int(m[2]), "world_size": int(m[3])}
        for m in _MEMBER.finditer(page)
    ]
    beats = [
        {
            "replica_id": html.unescape(m[2]).strip(),
            "seen_s": round(float(m[3]) * _UNIT[m[4]], 3),
            "old": "old" in m[1],
        }
        for m in _HEARTBEAT.finditer(page)
    ]
    return {"quorum_id": int(found[1]) if found else None, "members": members, "heartbeats": beats}


async def read_quorum(url: str, within: float = 2.0) -> dict[str, Any]:
    """:func:`parse_status_page` of the Lighthouse at ``url``.

    Raises:
        LighthouseError: it does not answer within ``within`` seconds, or not with a page.
        ReplicaGroupConfigError: ``url`` is not ``http://HOST:PORT``.
    """
    host, port = parse_lighthouse_url(url)
    body = bytearray()
    try:
        with anyio.fail_after(within):
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(f"GET /status HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                while len(body) < _MAX_PAGE:
                    try:
                        body.extend(await stream.receive())
                    except anyio.EndOfStream:
                        break
    except TimeoutError:
        raise LighthouseError(
            f"the Lighthouse at {url} did not answer within {within:g} s"
        ) from None
    except (OSError, anyio.BrokenResourceError) as exc:
        raise LighthouseError(f"the Lighthouse at {url}: {exc}") from None
    head, _, page = bytes(body).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or status[1] != b"200":
        raise LighthouseError(f"the Lighthouse at {url} did not answer its status page")
    return parse_status_page(page.decode("utf-8", "replace"))


class QuorumHistory:
    """The quorum's membership over time: one ``[time, quorum id, [replica ids]]`` per
    change of membership (a new quorum of the same replicas is not a change); the
    latest ``limit`` kept."""

    def __init__(self, limit: int = 32) -> None:
        self.changes: deque[list[Any]] = deque(maxlen=limit)

    def note(self, when: float, quorum: dict[str, Any]) -> bool:
        """Record ``quorum`` (:func:`parse_status_page`) seen at ``when`` if its
        membership changed; return whether it did."""
        if quorum.get("quorum_id") is None:
            return False
        members = sorted(str(m["replica_id"]) for m in quorum.get("members") or [])
        if self.changes and self.changes[-1][2] == members:
            return False
        self.changes.append([round(when, 2), quorum["quorum_id"], members])
        return True

    def to_json(self) -> list[list[Any]]:
        return [list(c) for c in self.changes]
