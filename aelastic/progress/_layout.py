"""The shared-memory layout of one worker's progress file (worker writes, agent reads).

One file per worker and attempt, ``SIZE`` bytes, mapped by both processes. The
first ``SLOTS`` native 64-bit integers are written only by the worker; aligned
8-byte stores are single instructions on every supported machine, so the agent
never sees a torn value. Times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one
clock for every process of the host). Section names follow the slots, one
``NAME_SIZE``-byte record each: the UTF-8 name (NUL padded, at most
``NAME_SIZE - 8`` bytes) then the longest time spent in it (int64 ns).

Imports nothing heavier than the standard library: workers load it.
"""

from __future__ import annotations

__all__ = (
    "ATTACHED",
    "ATTACH_NS",
    "BEATS",
    "CKPT_LOAD_NS",
    "CKPT_SAVE_NS",
    "ENDED_NS",
    "FILE_ENV",
    "FIRST_STEP",
    "FIRST_STEP_NS",
    "LAST_BEAT_NS",
    "MAGIC",
    "MAX_GAP_NS",
    "MAX_NAMES",
    "NAMES",
    "NAMES_OFFSET",
    "NAME_SIZE",
    "SECTION",
    "SECTION_EXIT_NS",
    "SECTION_NS",
    "SIZE",
    "SLOTS",
    "STACKS_FILE_ENV",
    "STACKS_SIGNAL_ENV",
    "STEP",
    "STEP_NS",
    "WORK_NS",
    "WORK_SPAN_NS",
)

from .._stacks_dump import STACKS_FILE_ENV as STACKS_FILE_ENV
from .._stacks_dump import STACKS_SIGNAL_ENV as STACKS_SIGNAL_ENV

#: Path of this worker's progress file; unset: the API does nothing.
FILE_ENV = "AELASTIC_PROGRESS_FILE"

SIZE = 4096
MAGIC = 0x61656C7031  # "aelp1": written last when the worker attaches

# Slot indexes (int64 each).
ATTACHED = 0  # MAGIC once the worker imported aelastic.progress
ATTACH_NS = 1  # when it attached
BEATS = 2  # heartbeat() calls
LAST_BEAT_NS = 3  # the latest heartbeat
MAX_GAP_NS = 4  # the longest interval between two heartbeats
STEP = 5  # the latest step (-1: none)
STEP_NS = 6  # when it was reported
SECTION = 7  # 1-based index of the innermost open section; 0: none
SECTION_NS = 8  # when that section was entered
SECTION_EXIT_NS = 9  # the latest section exit (0: sections never used)
NAMES = 10  # section names registered so far
FIRST_STEP = 11  # the first step of this attempt (valid once FIRST_STEP_NS is set)
FIRST_STEP_NS = 12  # when it was reported (0: no step yet)
CKPT_SAVE_NS = 13  # total time blocked in aelastic.checkpoint.save
CKPT_LOAD_NS = 14  # total time blocked in aelastic.checkpoint.load
WORK_NS = 15  # total own work measured by a work timer (work_timed: stragglers on GPUs)
WORK_SPAN_NS = 16  # the wall time those measurements cover (0: no work timer)
ENDED_NS = 17  # when the script ended and the interpreter began to exit (0: not yet)
SLOTS = 24

NAMES_OFFSET = SLOTS * 8
NAME_SIZE = 64
MAX_NAMES = (SIZE - NAMES_OFFSET) // NAME_SIZE
