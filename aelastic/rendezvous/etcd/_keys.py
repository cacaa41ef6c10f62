"""The etcd rendezvous's keys: one run's layout under ``<etcd_prefix>/<run_id>/``.

``etcd_prefix`` defaults to ``/aelastic/rdzv``; rounds are zero-padded so that a round
and the next are adjacent key ranges:

``round``                      decimal: the open round, the one new joiners enter
``closed``                     exists once the rendezvous is closed
``r/<round>/join/<node>``      JSON node descriptor, on the node's lease
``r/<round>/ctl/quorum``       exists once ``min_nodes`` joined (last call running)
``r/<round>/ctl/done``         JSON: participants in rank order + the revision they were read at
``r/<round>/store/...``        the agents' :class:`EtcdStore` of that round
"""

from __future__ import annotations

from ..._dataclass import dataclass

__all__ = ("RunKeys",)


@dataclass(frozen=True)
class RunKeys:
    """The keys of one run; ``base`` is ``<etcd_prefix>/<run_id>/``."""

    base: bytes

    @classmethod
    def for_run(cls, prefix: str, run_id: str) -> RunKeys:
        return cls(f"{prefix}/{run_id}/".encode())

    @property
    def open_round(self) -> bytes:
        return self.base + b"round"

    @property
    def closed(self) -> bytes:
        return self.base + b"closed"

    def round(self, round_: int) -> bytes:
        """The prefix of every key of round ``round_``."""
        return self.base + f"r/{round_:010d}/".encode()

    def joins(self, round_: int) -> bytes:
        """The prefix of round ``round_``'s join keys."""
        return self.round(round_) + b"join/"

    def join(self, round_: int, node_id: str) -> bytes:
        return self.joins(round_) + node_id.encode()

    def control(self, round_: int) -> bytes:
        """The prefix of round ``round_``'s control keys (quorum, done)."""
        return self.round(round_) + b"ctl/"

    def quorum(self, round_: int) -> bytes:
        return self.control(round_) + b"quorum"

    def done(self, round_: int) -> bytes:
        return self.control(round_) + b"done"

    def store(self, round_: int) -> bytes:
        """The prefix of round ``round_``'s agent store."""
        return self.round(round_) + b"store/"
