"""``python -m aelastic run``: a drop-in for ``torchrun`` (same flags, defaults, PET_* variables).

Exit status:

* ``0``: every worker of this node succeeded.
* ``93``: stopped by ``--max-no-progress-restarts`` (no step progress): do not requeue
* ``94``: this node failed a ``--node-health-check`` (or a built-in check) and stayed
  out until the job ended without it: repair or replace the host
* ``95``: this node was excluded after ``--exclude-node-after`` failed rounds and the
  job ended while it was out
* ``96``: preempted: SIGTERM (or SIGUSR1, the notice trapped with ``--checkpoint-dir``)
  stopped the job and ``--checkpoint-dir`` holds its newest complete step: retry, the
  job resumes there (docs/slurm.md, "Preemption and time limits")
* ``1``: the job failed (the ``ChildFailedError`` summary is on stderr, root cause last)
  or the agent could not carry on (a one-line ``aelastic run: error: ...``).
* ``2``: a bad flag or value (one line naming it and the fix); no worker was started.
  Also ``--replica-groups`` without torchft installed.
* ``128 + signum``: a handled signal (``--signals-to-handle``) stopped the job, e.g. 143
  for SIGTERM and 130 for SIGINT; the workers received the same signal first, then
  SIGKILL after ``--shutdown-timeout``. (torchrun exits 1 with a traceback here.)

With ``--replica-groups`` (torchft replica groups, ``docs/replica-groups.md``), ``0``
means at least one group completed; a group excluded after spending its restart
budget is named on stderr, and ``1`` means every group was excluded.

No Python traceback is printed for any of these; ``LOGLEVEL=DEBUG`` shows the agent's log.
Which of them a scheduler should retry (Slurm's requeue, a Job's ``podFailurePolicy``) is
``aelastic.schedulers._exit_codes``, shown in ``docs/kubernetes.md``.

When the launcher's own environment sets ``TORCHELASTIC_ERROR_FILE`` (a scheduler
reads it), a failed job writes there what torchrun's ``@record`` on its main does:
a copy of the root cause's error file with ``errorCode`` set to its exit code (nothing
when the root cause left no error file), or, for exit 1 from the agent and for a
handled signal, the exception in torch's error.json schema. Bad flags (exit 2) write
nothing.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from functools import partial

__all__ = ("main",)

_PREFIX = "aelastic run"


#: Seconds the lines the job queued for stderr get to be written before a direct print.
_DRAIN_TIMEOUT = 2.0


def _print_err(text: str) -> None:
    """Print ``text`` on stderr directly (in-process readers see it), after what the job
    queued for stderr (the goodput line, the notes) is written: a queued line never cuts
    into it. Bounded: a stalled stderr is given up on after :data:`_DRAIN_TIMEOUT`."""
    if "aelastic.workers._console" in sys.modules:  # nothing can be queued otherwise
        from ..workers._console import console_writer

        writer = console_writer("stderr")
        writer.wait_done(writer.enqueued, _DRAIN_TIMEOUT)
    print(text, file=sys.stderr, flush=True)


def _err(message: str) -> None:
    _print_err(f"{_PREFIX}: {message}")


def _note(message: str) -> None:
    """A line on stderr while the job runs, through the console's queue: a stalled
    stderr (``2>&1 | collector``) never blocks the launcher, and the line keeps its
    place among the workers' lines."""
    from ..workers._console import console_writer

    console_writer("stderr").write(f"{_PREFIX}: {message}\n".encode(errors="replace"))


def _setup_logging() -> None:
    import logging

    level = os.environ.get("LOGLEVEL", "WARNING").upper()
    logging.basicConfig(
        level=level if isinstance(logging.getLevelName(level), int) else "WARNING",
        format="[aelastic %(levelname)s %(asctime)s] %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (the arguments after ``run``), launch this node, return the exit code.

    When this is the process's entry point (``python -m aelastic run``), the process
    exits right here once the job is done: stdio and logging are flushed and the
    ``atexit`` hooks run (the events flush among them), then ``os._exit`` skips the
    interpreter's module teardown (tens of ms with anyio and asyncio loaded).
    As the entry point it also keeps the cyclic garbage collector off until the
    event loop starts (start-up only makes long-lived objects: modules, classes)
    and then freezes what start-up made, so no collection walks it again.
    Called from other code, it returns the code instead and leaves ``gc`` alone.
    """
    entry = _is_process_entry()
    if entry:
        # Start-up allocates only long-lived objects (modules, classes, the parser):
        # a collection cannot free anything, so none runs until the loop starts.
        gc.disable()
    code = _main(argv, startup_gc_off=entry)
    if entry:
        _fast_exit(code)
    return code


def _is_process_entry() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "aelastic.__main__"


def _fast_exit(code: int) -> None:
    import atexit
    import logging

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _slurm_store_address() -> str | None:
    """Inside a Slurm step: the first node's ``NodeAddr`` (one bounded ``scontrol``);
    else, or when Slurm does not say, None (the flag parser then uses the name)."""
    if not os.environ.get("SLURM_JOB_ID") or not os.environ.get("SLURM_STEP_ID"):
        return None
    import anyio

    from .._exceptions import ConfigError
    from ..schedulers._slurm import node_address, slurm_job

    try:
        job = slurm_job(os.environ)
    except ConfigError:
        return None  # the flag parser reports it, with the other usage errors
    if job is None:
        return None
    return anyio.run(node_address, job.nodes[0], dict(os.environ))


def _main(argv: Sequence[str], *, startup_gc_off: bool = False) -> int:
    from ._args import UsageError, parse_run_args

    try:
        parsed = parse_run_args(list(argv), slurm_address=_slurm_store_address())
    except UsageError as exc:
        _err(f"error: {exc}")
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    problem = parsed.missing_script()
    if problem is not None:
        _err(f"error: {problem}")
        return 2

    for warning in parsed.warnings:
        _err(f"warning: {warning}")
    for note in parsed.notes:
        _err(note)
    # torchrun sets these in its own environment so every worker inherits them.
    os.environ.update(parsed.set_env)
    _prestart_workers(parsed.entrypoint, parsed.args, parsed.config.nproc_per_node)
    _setup_logging()

    import anyio

    from ..agent import NoProgressError, SignalException
    from ..agent._policy import NO_PROGRESS_EXIT_CODE, PREEMPTED_EXIT_CODE
    from ..errors import ChildFailedError
    from ..nodes import NodeUnhealthyError
    from ..rendezvous import RendezvousGracefulExitError
    from ..replicas._exceptions import ReplicaGroupConfigError
    from ._exceptions import LaunchConfigError
    from ._launch import run_launch
    from ._preimport import import_now, job_modules

    import_now(job_modules(parsed.config))  # here, not in a thread once the loop runs
    if startup_gc_off:
        gc.freeze()  # what start-up made stays; later collections skip it
        gc.enable()
    try:
        if parsed.replica_groups is not None:
            from ._replica_groups import report_replica_groups, run_replica_groups

            job = partial(run_replica_groups, groups=parsed.replica_groups)
            report_replica_groups(
                anyio.run(
                    partial(job, parsed.config, parsed.entrypoint, parsed.args, handle_signals=True)
                ),
                _err,
            )
        else:
            anyio.run(
                partial(
                    run_launch,
                    parsed.config,
                    parsed.entrypoint,
                    parsed.args,
                    handle_signals=True,
                    say=_note,
                    goodput_line=True,
                )
            )
    except NoProgressError as exc:
        _record_for_scheduler(exc)
        _print_err(exc.format_msg())
        _err("stopped: no step progress over --max-no-progress-restarts attempts; do not requeue")
        return NO_PROGRESS_EXIT_CODE
    except ChildFailedError as exc:
        _record_for_scheduler(exc)
        _print_err(exc.format_msg())
        return 1
    except SignalException as exc:
        _record_for_scheduler(exc)
        what = "the workers were stopped" if exc.workers_started else "no worker had started"
        if exc.persisted_step is not None:
            _err(
                f"preempted ({exc.sigval.name}); {what}; step {exc.persisted_step} is in "
                f"{parsed.config.checkpoints.dir}: run the job again to resume there"
            )
            return PREEMPTED_EXIT_CODE
        _err(f"stopped by {exc.sigval.name}; {what}")
        return 128 + int(exc.sigval)
    except LaunchConfigError as exc:
        _err(f"error: {exc}")
        return 2
    except NodeUnhealthyError as exc:
        _record_for_scheduler(exc)
        _err(f"{exc.kind}: {exc}")
        return exc.exit_code
    except RendezvousGracefulExitError as exc:  # a spare node let go: nothing failed
        _err(f"exiting: {exc}")
        return 0
    except ReplicaGroupConfigError as exc:  # torchft not installed
        _err(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as exc:  # one line, no traceback
        _record_for_scheduler(exc)
        _err(f"error: {_describe(exc)}")
        if os.environ.get("LOGLEVEL", "").upper() == "DEBUG":
            import traceback

            traceback.print_exception(exc)
        return 1
    return 0


def _record_for_scheduler(exc: Exception) -> None:
    """Write ``exc`` to this process's ``TORCHELASTIC_ERROR_FILE`` as torchrun does.

    torchrun's main is decorated with ``@record``; this is what that decorator does
    with the exception leaving it (see ``ErrorHandler.record_failure``). Nothing
    happens when the variable is unset; never raises.
    """
    from ..errors._record import ErrorHandler

    ErrorHandler().record_failure(exc)


def _prestart_workers(entrypoint: str, args: Sequence[str], nproc: int) -> None:
    """Start the workers' interpreters now, so they boot while the agent imports.

    The agent's warm pool adopts them when its interpreter, flags and start-up
    environment still match (otherwise they are discarded and it spawns afresh);
    never raises. ``AELASTIC_WARM_WORKERS=0`` turns it off.
    """
    from ..workers._warm import prestart_warm_workers

    prestart_warm_workers([entrypoint, *map(str, args)], nproc)


def _describe(exc: BaseException) -> str:
    while len(getattr(exc, "exceptions", ())) == 1:
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__module__ == "builtins" else text
