"""The etcd rendezvous's stored values: the open round number, a joined node's descriptor and
a completed round (``r/<round>/ctl/done``), read, and the ``done`` record written. Plain
functions; a value that is not what aelastic writes raises
:class:`~aelastic.rendezvous.RendezvousStateError` naming the key, what it holds and the fix."""

from __future__ import annotations

import json
from typing import Any, cast

from ..._dataclass import dataclass
from .._exceptions import RendezvousStateError

__all__ = ("Round", "encode_done", "parse_done", "parse_joiner", "parse_round", "state_error")


@dataclass
class Round:
    """A completed round: its number, participants in rank order, and the revision they were
    read at."""

    number: int
    nodes: list[dict[str, Any]]
    revision: int

    @property
    def ids(self) -> list[str]:
        return [str(n["id"]) for n in self.nodes]


def state_error(key: bytes, raw: bytes, what: str, where: str) -> RendezvousStateError:
    """The error for ``key`` (on etcd ``where``) holding ``raw`` where ``what`` was expected."""
    return RendezvousStateError(
        f"rendezvous key {key.decode()!r} on {where} holds {raw[:80]!r}: {what}; "
        "it was written by something else (use another run_id or delete the prefix)"
    )


def parse_round(key: bytes, raw: bytes | None, where: str) -> int | None:
    """The open round stored at ``key`` (None: no round yet)."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace")
    if not text.isdigit():
        raise state_error(key, raw, "expected a decimal round number", where)
    return int(text)


def parse_done(round_: int, key: bytes, raw: bytes, where: str) -> Round:
    """Round ``round_`` as its ``done`` key ``key`` records it."""
    try:
        data = json.loads(raw)
        nodes = data["nodes"]
        revision = int(data["revision"])
        if not isinstance(nodes, list) or not all(
            isinstance(n, dict) and isinstance(n.get("id"), str) for n in nodes
        ):
            raise ValueError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise state_error(key, raw, "expected JSON {nodes: [...], revision: int}", where) from None
    return Round(round_, nodes, revision)


def parse_joiner(key: bytes, raw: bytes, prefix: bytes, where: str) -> dict[str, Any]:
    """The node descriptor at join key ``key`` (under ``prefix``), with its ``id`` from the key."""
    try:
        node = json.loads(raw)
        node["id"] = key[len(prefix) :].decode()
    except (ValueError, TypeError, UnicodeDecodeError):
        raise state_error(key, raw, "expected a JSON node", where) from None
    return cast(dict[str, Any], node)


def encode_done(nodes: list[dict[str, Any]], revision: int) -> bytes:
    """The ``done`` record of a round whose participants are ``nodes`` (in rank order), read
    at ``revision``: what :func:`parse_done` reads."""
    return json.dumps({"nodes": nodes, "revision": revision}, separators=(",", ":")).encode()
