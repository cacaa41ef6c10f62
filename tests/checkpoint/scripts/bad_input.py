"""Feeds aelastic.checkpoint bad input in one process; prints one JSON line of outcomes.

Run with AELASTIC_CHECKPOINT_DIR, RANK=0 and WORLD_SIZE=1 set (as the agent would).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from _committed import committed  # this script's directory

from aelastic import checkpoint

root = os.environ["AELASTIC_CHECKPOINT_DIR"]
out: dict[str, Any] = {}


def attempt(name: str, call: Callable[[], object]) -> None:
    try:
        call()
    except checkpoint.CheckpointError as exc:
        out[name] = str(exc)
    else:
        out[name] = None


def listing() -> list[str]:
    return committed(root)


checkpoint.save({"w": torch.arange(4.0), "note": "ok"}, step=5)
good = listing()
attempt("unpicklable", lambda: checkpoint.save({"f": lambda: 0}, step=6))
attempt("lower", lambda: checkpoint.save({"w": torch.zeros(1)}, step=4))
huge = torch.empty(1 << 50, dtype=torch.uint8, device="meta")
attempt("memory", lambda: checkpoint.save({"w": huge}, step=7))
attempt("bad_step", lambda: checkpoint.save({}, step=-1))
attempt("dcp_lower", lambda: checkpoint.MemoryWriter(step=4))
attempt("async_unpicklable", lambda: checkpoint.save({"f": lambda: 0}, step=6, asynchronous=True))
out["intact"] = listing() == good
os.environ["AELASTIC_CHECKPOINT_DIR"] = os.path.join(root, good[0], "x")
attempt("not_writable", lambda: checkpoint.save({"w": torch.zeros(1)}, step=8))
del os.environ["AELASTIC_CHECKPOINT_DIR"]
attempt("outside", lambda: checkpoint.save({}, step=9))
out["load_outside"] = checkpoint.load()
out["intact_after_all"] = listing() == good
loaded = torch.load(os.path.join(root, good[0]), weights_only=False)
out["saved"] = [loaded["w"].tolist(), loaded["note"]]
print(json.dumps(out))
sys.stdout.flush()
