"""A worker using torch's own expiration timer (FileTimerClient), as under torchrun.

The first attempt arms a 1 s timer around a wait that never ends; later attempts
arm and release one, then exit 0.
"""

import os
import threading

import torch.distributed.elastic.timer as timer

timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))

if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    with timer.expires(after=1, scope="stuck_in_collective"):
        threading.Event().wait()
else:
    with timer.expires(after=60, scope="quick"):
        pass
