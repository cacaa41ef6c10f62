"""Record what a worker saw, for the torchrun parity test; then print, and maybe fail.

    parity_worker.py [ARGS...]     (also runs as ``-m parity_worker`` and via --run-path)

Writes ``$PARITY_OUT/<RANK>.json``: the whole environment, ``sys.argv``,
``sys.path[0]``, the cwd, what stdin is, whether it leads its process group/session, the
signal mask and dispositions the kernel reports (``/proc/self/status``, before Python
touches any beyond its own start-up) and what ``signal.getsignal`` says. Then prints
one line to stdout and one to stderr (the log layout and console checks read them).
Then, with ``$PARITY_BARRIER``, waits for the other rank (see ``_barrier``). When
RANK is in ``$PARITY_FAIL_RANKS`` (comma list) it raises: under torch's ``@record``
with ``PARITY_RECORD=1`` (the only case that imports torch), uncaught otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _status() -> dict[str, str]:
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return {k: fields[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")}


def _disposition(sig: signal.Signals) -> str:
    handler = signal.getsignal(sig)
    if handler is signal.SIG_DFL:
        return "default"
    if handler is signal.SIG_IGN:
        return "ignore"
    return "handler" if handler is not None else "none"


def _record() -> None:
    rank = os.environ.get("RANK", "norank")
    seen = {
        "env": dict(os.environ),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "proc_status": _status(),
        "getsignal": {
            s.name: _disposition(s)
            for s in signal.valid_signals()
            if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)
        },
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "name": __name__,
        "path0": sys.path[0],
        # what fd 0 is ("pipe:[inode]" kept as "pipe"), and how the process is grouped
        "stdin": os.readlink("/proc/self/fd/0").partition(":")[0],
        "own_process_group": os.getpgid(0) == os.getpid(),
        "own_session": os.getsid(0) == os.getpid(),
    }
    path = os.path.join(os.environ["PARITY_OUT"], f"{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(seen, f)
    os.rename(path + ".tmp", path)
    print(f"parity stdout rank {rank}", flush=True)
    print(f"parity stderr rank {rank}", file=sys.stderr, flush=True)


def _fails() -> bool:
    ranks = os.environ.get("PARITY_FAIL_RANKS", "")
    return os.environ.get("RANK") in ranks.split(",")


def _barrier() -> None:
    """With ``$PARITY_BARRIER`` (a FIFO; two ranks): meet the other rank.

    Opening a FIFO blocks until the other end is opened too, so no rank fails before
    both have recorded. A failing rank ignores SIGTERM first: a launcher that saw the
    other rank fail and stops this one cannot cut it short, so each fails on its own
    with its own traceback, as on two nodes. (Only failing ranks: torchrun's
    --run-path keeps a worker that returned alive until the others end, and would
    wait 30 s for one that ignores SIGTERM.)
    """
    path = os.environ.get("PARITY_BARRIER")
    if path:
        if _fails():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(path, "r" if os.environ.get("RANK") == "0" else "w"):
            pass


def main() -> None:
    if _fails():
        raise RuntimeError(f"parity worker rank {os.environ.get('RANK')} failed on purpose")


if __name__ == "__main__":
    _record()
    _barrier()
    if os.environ.get("PARITY_RECORD") == "1":
        from torch.distributed.elastic.multiprocessing.errors import record

        record(main)()
    else:
        main()
