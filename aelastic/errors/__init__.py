"""Worker failures: ``@record`` error files, ``ProcessFailure``, ``ChildFailedError``.

The error file contract is torch's (``TORCHELASTIC_ERROR_FILE`` holding
``{"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}}``), so a
worker decorated with torch's ``@record`` reports to aelastic and a worker
decorated with :func:`record` reports to torch's tools. Never imports torch.
"""

from ._exceptions import ChildFailedError as ChildFailedError
from ._failure import ProcessFailure as ProcessFailure
from ._record import record as record

#: The module ``run --run-path`` runs with ``python -m`` in front of the script and its
#: arguments (a worker reporting its exception like ``@record``). Defined here, not
#: imported from it: the package must not load the module it is asked to run. Not in
#: ``__all__``: only the launcher reads it.
RUN_SCRIPT_MODULE = f"{__name__}._run_script"

__all__ = (
    "ChildFailedError",
    "ProcessFailure",
    "record",
)
