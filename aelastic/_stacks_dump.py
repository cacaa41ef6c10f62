"""Worker side of the agent's stack capture: dump every thread's stack on its signal.

The agent (``aelastic.agent._stacks``) passes a stacks file and a real-time signal
number in the worker's environment; :func:`register_from_env` registers
``faulthandler`` to write every thread's stack to that file when the signal arrives.
Called by the warm-worker bootstrap and by :mod:`aelastic.progress` on attach,
whichever comes first: the first call takes the variables out of ``os.environ``, so
the handler is registered once with one open file, and processes the worker starts
(spawned data loader workers, ``mp.spawn``) do not inherit them.

With the stacks, the agent asks for torch's flight recorder (the last collectives of
every process group, NCCL and gloo alike): it names a FIFO (:data:`FR_TRIGGER_ENV`) and
a dump file (:data:`FR_FILE_ENV`). :func:`register_from_env` starts one daemon thread
blocked in opening that FIFO for reading; when the agent writes to it (a hang, before
anything is stopped), the thread writes torch's dump to the file and removes the FIFO,
which tells the agent it is done. The thread runs Python, so it needs the GIL: a main
thread hung in a collective's wait or a CUDA synchronize has released it.

Standard library only, and not part of :mod:`aelastic.progress` (importing that
marks a worker as reporting progress): the warm bootstrap imports just this.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

__all__ = (
    "FR_FILE_ENV",
    "FR_TRIGGER_ENV",
    "STACKS_FILE_ENV",
    "STACKS_SIGNAL_ENV",
    "flight_recorder_dump",
    "register_from_env",
)

#: Where faulthandler writes every thread's stack when the agent sends the signal.
STACKS_FILE_ENV = "AELASTIC_STACKS_FILE"
#: The signal number that asks a worker for its stacks (a real-time signal).
STACKS_SIGNAL_ENV = "AELASTIC_STACKS_SIGNAL"
#: The FIFO the agent writes to when it wants torch's flight recorder dump.
FR_TRIGGER_ENV = "AELASTIC_FR_TRIGGER"
#: Where the worker writes that dump: this prefix plus its global rank (``RANK``), in
#: torch's format and name (``python -m torch.distributed.flight_recorder.fr_trace``).
FR_FILE_ENV = "AELASTIC_FR_FILE"

#: torch's dump functions, most specific first: NCCL's recorder (CUDA events; CUDA builds
#: only) and the one every other backend (gloo) records in.
_DUMPS = ("_dump_nccl_trace", "_dump_fr_trace")


def register_from_env() -> None:
    """Register the stacks dump and the flight recorder trigger named by the environment.

    Once (the variables are taken out of ``os.environ``); never raises. The stacks
    file stays open for the life of the process (the handler runs in signal context
    and cannot open it then). A missing variable, an unwritable file or a bad signal
    number leaves the worker without a handler (the agent then uses py-spy).
    """
    _register_stacks(os.environ.pop(STACKS_FILE_ENV, None), os.environ.pop(STACKS_SIGNAL_ENV, None))
    trigger = os.environ.pop(FR_TRIGGER_ENV, None)
    prefix = os.environ.pop(FR_FILE_ENV, None)
    if trigger and prefix:
        threading.Thread(
            target=_serve_flight_recorder, args=(trigger, prefix), name="aelastic-fr", daemon=True
        ).start()


def _register_stacks(path: str | None, signum: str | None) -> None:
    if not path or not signum:
        return
    try:
        import faulthandler  # built in; keeps a reference to the file

        stream = open(path, "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(int(signum), file=stream, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return


def _serve_flight_recorder(trigger: str, prefix: str) -> None:
    """Wait for the agent's byte on ``trigger``, dump to ``prefix<RANK>``, remove ``trigger``."""
    try:
        with open(trigger, "rb") as fifo:  # blocks (GIL released) until the agent opens it
            fifo.read(1)
    except OSError:
        return
    try:
        data = flight_recorder_dump()
        if data is not None:
            out = prefix + os.environ.get("RANK", "0")
            tmp = f"{out}.tmp"
            with open(tmp, "wb") as fp:
                fp.write(data)
            os.replace(tmp, out)
    except Exception:  # a failed dump must not disturb the worker
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(trigger)  # done: the agent waits for the FIFO to go


def flight_recorder_dump() -> bytes | None:
    """torch's flight recorder dump (pickle bytes), or None without a process group.

    Imports nothing of torch that is not loaded: a worker that has not imported
    ``torch.distributed`` has no collectives to show. Of torch's recorders (NCCL's,
    then gloo's), the first with entries is returned; when none has any, the first
    available (it still shows the process groups). Without each collective's Python
    stack: torch symbolises those on first use, which took seconds (the stacks file
    shows where every thread is). Raises what torch raises.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import pickle  # only on a hang

    import torch._C._distributed_c10d as c10d

    first = None
    for name in _DUMPS:
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data: bytes = dump(includeStackTraces=False)
        except TypeError:  # a torch without that argument
            data = dump()
        if pickle.loads(data).get("entries"):  # torch's own bytes
            return data
        first = first if first is not None else data
    return first
