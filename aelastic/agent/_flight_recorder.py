"""torch's flight recorder dump from live workers, before a hung round is stopped.

Beside each worker's stacks file the agent creates a FIFO and names it, with the dump
file, in the worker's environment (:func:`flight_recorder_env`); the worker's side
(:mod:`aelastic._stacks_dump`) waits on that FIFO in a thread. On a hang (or an expired
file timer) :func:`dump_flight_recorder` writes one byte to it and waits, bounded, for
the worker to write torch's dump and remove the FIFO. A worker that never opened the
FIFO (no aelastic code ran in it, e.g. a cold worker without :mod:`aelastic.progress`)
is skipped at once. Nothing here imports torch.

:func:`torch_defaults` names the torch variables the agent sets for such a worker, each
only when the user set neither it nor its older name: the recorder's buffer (2000
entries, torch 2.13's default; some older releases record nothing by default) and
where torch's own dumps (``TORCH_NCCL_DUMP_ON_TIMEOUT``, on a NCCL watchdog timeout)
are written: next to the stacks.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Mapping

import anyio

from .._stacks_dump import FR_FILE_ENV, FR_TRIGGER_ENV

__all__ = (
    "FR_TIMEOUT",
    "dump_flight_recorder",
    "flight_recorder_env",
    "flight_recorder_files",
    "remove_trigger",
    "torch_defaults",
    "written_dumps",
)

log = logging.getLogger("aelastic.agent")

#: The name of a dump, before the global rank (torch's own name for them).
DUMP_PREFIX = "nccl_trace_rank_"
#: How long one worker may take to write its dump (torch pickles at most its buffer).
FR_TIMEOUT = 3.0
_SETTLE_INTERVAL = 0.005
#: Entries in torch's ring buffer when the user did not say (torch's own default).
TRACE_BUFFER_SIZE = "2000"
#: Each variable, then its older name (torch reads either; 2.13 warns on the older one).
_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_TEMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_files(stacks_file: str) -> tuple[str, str]:
    """``(trigger FIFO, dump prefix)`` next to ``stacks_file``.

    The worker writes its dump to the prefix plus its global rank, the name torch's own
    dumps have, so ``python -m torch.distributed.flight_recorder.fr_trace <attempt dir>``
    reads every rank's. ``.../attempt_<n>/<local_rank>/stacks.txt`` gives ``fr.fifo``
    and ``nccl_trace_rank_`` in that directory; ``attempt_<n>_<r>.stacks.txt`` (no log
    directory) gives ``attempt_<n>_<r>.fr.fifo`` and ``attempt_<n>_<r>.nccl_trace_rank_``.
    """
    base = stacks_file.removesuffix("stacks.txt")
    return f"{base}fr.fifo", f"{base}{DUMP_PREFIX}"


def written_dumps(stacks_file: str) -> list[str]:
    """The flight recorder dumps next to ``stacks_file`` (``<prefix><rank>``); never raises."""
    prefix = flight_recorder_files(stacks_file)[1]
    directory, start = os.path.split(prefix)
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    return sorted(
        os.path.join(directory, n)
        for n in names
        if n.startswith(start) and n[len(start) :].isdigit()
    )


def flight_recorder_env(stacks_file: str) -> dict[str, str]:
    """Create the trigger FIFO next to ``stacks_file``; the worker's variables naming it.

    Empty when the FIFO cannot be created (a file system without FIFOs): that worker
    is then never asked. A FIFO left by an earlier round at that path is reused.
    """
    trigger, prefix = flight_recorder_files(stacks_file)
    try:
        os.mkfifo(trigger, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        log.debug("no flight recorder trigger at %s: %s", trigger, exc)
        return {}
    return {FR_TRIGGER_ENV: trigger, FR_FILE_ENV: prefix}


def torch_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The torch variables to add to a worker's ``env`` (never one the user set).

    Only for a worker asked for its flight recorder (``env`` names the dump prefix):
    ``TORCH_FR_BUFFER_SIZE=2000`` unless it or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is set,
    and ``TORCH_FR_DUMP_TEMP_FILE`` (the prefix of torch's own dumps, which add the
    global rank) the same prefix unless it or ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` is set.
    """
    prefix = env.get(FR_FILE_ENV)
    if not prefix:
        return {}
    out = {}
    if not any(name in env for name in _BUFFER):
        out[_BUFFER[0]] = TRACE_BUFFER_SIZE
    if not any(name in env for name in _TEMP_FILE):
        out[_TEMP_FILE[0]] = prefix
    return out


def _answered(stacks_file: str, trigger: str) -> tuple[bool, str | None]:
    """``(whether the worker removed its FIFO, the dump's path if it wrote one)``."""
    if os.path.lexists(trigger):
        return False, None
    return True, next(iter(written_dumps(stacks_file)), None)


async def dump_flight_recorder(stacks_file: str) -> str | None:
    """Ask the worker behind ``stacks_file``'s FIFO for torch's dump; its path when written.

    None at once when no worker waits on the FIFO (none attached, or it already
    answered); None after :data:`FR_TIMEOUT` when the worker does not finish (its GIL
    held by a hung extension, say); None when it has no process group. Never raises
    for the worker's sake (an OSError is logged). Cancellation: stops waiting; the
    worker may still write its dump.
    """
    trigger, prefix = flight_recorder_files(stacks_file)
    try:
        fd = os.open(trigger, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ENOENT):  # no reader / no FIFO: not asked
            log.warning("could not ask for the flight recorder at %s: %s", trigger, exc)
        return None
    try:
        os.write(fd, b"d")
    except OSError as exc:
        log.warning("could not ask for the flight recorder at %s: %s", trigger, exc)
        return None
    finally:
        os.close(fd)
    # Bounded: short looks for the worker removing its FIFO, once per hang.
    for _ in range(int(FR_TIMEOUT / _SETTLE_INTERVAL)):
        await anyio.sleep(_SETTLE_INTERVAL)
        answered, written = _answered(stacks_file, trigger)
        if answered:
            return written
    log.warning("worker did not write its flight recorder dump within %s s: %s", FR_TIMEOUT, prefix)
    return None


def remove_trigger(stacks_file: str) -> None:
    """Remove the trigger FIFO next to ``stacks_file`` (the round is over); never raises."""
    with contextlib.suppress(OSError):
        os.remove(flight_recorder_files(stacks_file)[0])
