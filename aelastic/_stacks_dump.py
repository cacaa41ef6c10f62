"""Worker side of the agent's stack capture: dump every thread's stack on its signal.

The agent (``aelastic.agent._stacks``) passes a stacks file and a real-time signal
number in the worker's environment; :func:`register_from_env` registers
``faulthandler`` to write every thread's stack to that file when the signal arrives.
Called by the warm-worker bootstrap and by :mod:`aelastic.progress` on attach,
whichever comes first: the first call takes the variables out of ``os.environ``, so
the handler is registered once with one open file, and processes the worker starts
(spawned data loader workers, ``mp.spawn``) do not inherit them.

Standard library only, and not part of :mod:`aelastic.progress` (importing that
marks a worker as reporting progress): the warm bootstrap imports just this.
"""

from __future__ import annotations

import os

__all__ = ("STACKS_FILE_ENV", "STACKS_SIGNAL_ENV", "register_from_env")

#: Where faulthandler writes every thread's stack when the agent sends the signal.
STACKS_FILE_ENV = "AELASTIC_STACKS_FILE"
#: The signal number that asks a worker for its stacks (a real-time signal).
STACKS_SIGNAL_ENV = "AELASTIC_STACKS_SIGNAL"


def register_from_env() -> None:
    """Register the stacks dump named by the environment, once; never raises.

    The file stays open for the life of the process (the handler runs in signal
    context and cannot open it then). A missing variable, an unwritable file or a bad
    signal number leaves the worker without a handler (the agent then uses py-spy).
    """
    path = os.environ.pop(STACKS_FILE_ENV, None)
    signum = os.environ.pop(STACKS_SIGNAL_ENV, None)
    if not path or not signum:
        return
    try:
        import faulthandler  # built in; keeps a reference to the file

        stream = open(path, "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(int(signum), file=stream, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return
