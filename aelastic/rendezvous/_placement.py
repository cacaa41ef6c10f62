"""Placement: which member of a completed round gets which group rank.

A plain decision, shared by the c10d and etcd backends: the node that completes a
round reads every member's descriptor (published with its join) and calls
:func:`place`. Three rules, applied in this order:

1. **The store's host first** (``lead``, c10d): its workers' store (``MASTER_ADDR``)
   stays on the machine every node reaches.
2. **Topology key** (``--node-rank-order``): members are grouped by the key their node
   published (``hostname``, or the value of an environment variable such as a rack or
   switch label) and groups follow in key order, so neighbouring ranks share a switch.
   The lead's group comes first (the lead at its head), so it is never split; members
   that published no key come last.
3. **Sticky ranks** (always on; ties of rule 2): a member keeps the group rank it had
   in the most recent round any member was admitted to. Newcomers (and members whose
   last rank is from an older round) take the ranks that leavers freed, lowest first,
   in the backend's existing order (c10d: join order); the rest follow. Holes that no
   newcomer fills close up, survivors keeping their relative order. So a restart with
   unchanged membership keeps every group rank, and a spare that replaces a lost node
   takes its rank while everyone else keeps theirs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._dataclass import dataclass
from ._exceptions import RendezvousConfigError

__all__ = ("Seat", "place", "rank_key", "check_rank_order", "seat_of")

_FORMS = "'hostname' or 'env:VAR' (VAR: an environment variable set on every node)"


@dataclass(frozen=True)
class Seat:
    """What the completing node knows of one member, from its descriptor.

    ``key``: its topology key (None: it published none). ``last``: the ``(epoch, round,
    rank)`` of the last round it was admitted to (None: none yet).
    """

    key: str | None = None
    last: tuple[int, int, int] | None = None


def seat_of(record: Mapping[str, Any]) -> Seat:
    """The placement facts of a node's join record (its ``key`` and ``last`` fields).

    Lenient: a field of the wrong type counts as absent (placement is a preference,
    never a reason to fail a round).
    """
    key, last = record.get("key"), record.get("last")
    valid = (
        isinstance(last, list)
        and len(last) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in last)
    )
    return Seat(
        key if isinstance(key, str) else None,
        (last[0], last[1], last[2]) if valid and last is not None else None,
    )


def check_rank_order(spec: str, source: str = "--node-rank-order") -> str:
    """Validate a ``--node-rank-order`` value's form (named ``source`` in the error);
    return it stripped.

    Raises:
        RendezvousConfigError: neither ``hostname`` nor ``env:VAR``.
    """
    text = spec.strip()
    if text == "hostname":
        return text
    if text.startswith("env:") and text[4:].strip() and "=" not in text:
        return "env:" + text[4:].strip()
    raise RendezvousConfigError(
        f"{source} {spec!r}: unknown key; pass {_FORMS}, e.g. --node-rank-order "
        "env:RACK with RACK=<rack or switch label> in each agent's environment"
    )


def rank_key(spec: str, hostname: str, environ: Mapping[str, str] | None = None) -> str:
    """This node's topology key under ``spec`` (see :func:`check_rank_order`).

    Raises:
        RendezvousConfigError: a bad form, or ``env:VAR`` with VAR unset or empty here.
    """
    text = check_rank_order(spec)
    if text == "hostname":
        return hostname
    var = text[4:]
    value = (os.environ if environ is None else environ).get(var, "").strip()
    if not value:
        raise RendezvousConfigError(
            f"--node-rank-order {text}: the environment variable {var} is unset or empty on "
            f"this node; set {var} (e.g. to its rack or switch name) in the environment of "
            "every node's agent, or drop --node-rank-order"
        )
    return value


def _sticky(seats: Sequence[Seat]) -> list[int]:
    """Indices of ``seats`` in sticky order (rule 3 of the module docstring)."""
    rounds = [s.last[:2] for s in seats if s.last is not None]
    latest = max(rounds, default=None)
    claims: dict[int, int] = {}  # claimed rank -> seat index
    newcomers: list[int] = []
    for i, seat in enumerate(seats):
        last = seat.last
        if last is not None and last[:2] == latest and last[2] not in claims:
            claims[last[2]] = i
        else:
            newcomers.append(i)
    top = max(claims, default=-1)
    holes = [r for r in range(top + 1) if r not in claims]
    position = {i: r for r, i in claims.items()}
    for hole, i in zip(holes, newcomers, strict=False):
        position[i] = hole
    rest = newcomers[len(holes) :]
    placed = sorted(position, key=lambda i: position[i])
    return placed + rest


def place(seats: Sequence[Seat], lead: int = -1) -> list[int]:
    """The members' indices in group-rank order (see the module docstring).

    ``seats`` are in the backend's existing order (ties keep it); ``lead`` is the index
    of the member that must get rank 0 (-1: none).
    """
    order = _sticky(seats)
    if any(s.key is not None for s in seats):
        lead_key = seats[lead].key if lead >= 0 else None

        def group(i: int) -> tuple[int, str]:
            key = seats[i].key
            if key is None:
                return (2, "")
            return (0 if lead >= 0 and key == lead_key else 1, key)

        order.sort(key=group)  # stable: sticky order within a group
    if lead >= 0:
        order.remove(lead)
        order.insert(0, lead)
    return order
