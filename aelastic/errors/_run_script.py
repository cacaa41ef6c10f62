"""``python -m aelastic.errors._run_script SCRIPT [ARG...]``: a worker of ``run --run-path``.

torchrun's ``--run-path`` calls ``runpy.run_path(SCRIPT, run_name="__main__")`` in
the worker under the ``@record`` it wraps every function entry point in, so a
script that is not decorated still leaves its uncaught exception in
``$TORCHELASTIC_ERROR_FILE`` and its traceback in the failure summary. This does
the same with :func:`aelastic.errors.record`.

The script sees what ``python SCRIPT ARG...`` would give it: ``sys.argv`` is
``[SCRIPT, ARG...]``, ``sys.path[0]`` its directory, ``__name__`` ``"__main__"``.
``SystemExit`` keeps its code (``sys.exit(0)`` ends cleanly); an exception is
recorded, then printed and exits 1 as usual; ``KeyboardInterrupt`` is not recorded.
Imports only ``aelastic.errors`` (a few ms, no torch).
"""

from __future__ import annotations

import os
import runpy
import sys

from . import RUN_SCRIPT_MODULE
from ._record import record

__all__ = ("main",)


def main() -> None:
    """Run ``sys.argv[1]`` as ``__main__`` with the remaining arguments, recorded."""
    if len(sys.argv) < 2:
        sys.stderr.write(f"usage: python -m {RUN_SCRIPT_MODULE} SCRIPT [ARG...]\n")
        raise SystemExit(2)
    script = sys.argv[1]
    del sys.argv[0]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    record(runpy.run_path)(script, run_name="__main__")


if __name__ == "__main__":
    main()
