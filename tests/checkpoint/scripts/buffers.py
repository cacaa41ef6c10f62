"""Save buffers in one process; prints one JSON line of what it saw.

Run with AELASTIC_CHECKPOINT_DIR, RANK=0 and WORLD_SIZE=1 set (as the agent would).
"""

from __future__ import annotations

import json
import os

import torch
from _committed import committed  # this script's directory

from aelastic import checkpoint
from aelastic.checkpoint import _buffer, _worker

root = os.environ["AELASTIC_CHECKPOINT_DIR"]
state = {f"w{i}": torch.full((1 << 18,), float(i)) for i in range(8)}  # 8 MiB, 8 tensors
out: dict[str, object] = {}


# reserve(): the first save's file fits in the pages prepared ahead (no allocation in it)
checkpoint.reserve(state)
checkpoint.wait()
spare = _buffer.spare_path(root, 0)
out["reserved"] = os.stat(spare).st_blocks * 512
checkpoint.save(state, step=0)
prepared = [_worker._background is not None]  # a background preparation after the save
(first,) = committed(root)
out["first_file"] = os.path.getsize(os.path.join(root, first))
for step in (1, 2, 3):
    checkpoint.save(state, step=step)
    prepared.append(_worker._background is not None)
out["prepared"] = prepared
out["steady"] = committed(root)
# the oldest kept file removed behind the saver's back: the next save scans again
os.unlink(os.path.join(root, out["steady"][0]))
state["w0"].fill_(40.0)
checkpoint.save(state, step=4)
out["after_removal"] = committed(root)
loaded = torch.load(os.path.join(root, out["after_removal"][-1]), weights_only=True)
out["loaded"] = [loaded["w0"][0].item(), loaded["w7"][0].item()]
print(json.dumps(out))
