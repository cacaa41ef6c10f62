"""A few seconds of seeded fuzzing of the checkpoint peer listener (``benchmarks/fuzz.py
--target peer`` runs it longer): random bytes and mutated messages, before and after a
valid handshake, against a real listener on loopback. The fuzzer asserts that each bad
connection is closed within a bound, that a valid client is served after them, and that
no file appears in the memory directory."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import anyio

FUZZ = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz.py"


def fuzz_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aelastic_bench_fuzz", FUZZ)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_peer_listener_survives_random_and_mutated_input() -> None:
    fuzz = fuzz_module()
    counts = anyio.run(fuzz.peer, 3.0, 37)
    # every kind of case ran, and the valid client was served between them
    assert counts["raw"] and counts["handshake"] and counts["request"], counts
    assert counts["valid"] >= 1
