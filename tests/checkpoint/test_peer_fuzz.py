"""A few seconds of seeded fuzzing of the checkpoint peer listener (``benchmarks/fuzz.py
--target peer`` runs it longer): random bytes and mutated messages, before and after a
valid handshake, against a real listener on loopback. The fuzzer (``_fuzz``) asserts that
each bad connection is closed within a bound, that a valid client is served after them,
and that no file appears in the memory directory."""

from __future__ import annotations

import anyio

from . import _fuzz


def test_the_peer_listener_survives_random_and_mutated_input() -> None:
    counts = anyio.run(_fuzz.peer, 3.0, 37)
    # every kind of case ran, and the valid client was served between them
    assert counts["raw"] and counts["handshake"] and counts["request"], counts
    assert counts["valid"] >= 1
