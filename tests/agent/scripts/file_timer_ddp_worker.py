"""Two workers under torch's expiration timer: local rank 0 arms expires(after=2)
around a wait that never ends (hung), local rank 1 idles in a healthy peer loop.
Later attempts exit 0."""

import os
import threading
import time

import torch.distributed.elastic.timer as timer

timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))


def stuck_in_collective() -> None:
    with timer.expires(after=2, scope="allreduce_step_7"):
        threading.Event().wait()


def healthy_peer() -> None:
    while True:
        time.sleep(0.05)


if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["LOCAL_RANK"] == "0":
        stuck_in_collective()
    healthy_peer()
