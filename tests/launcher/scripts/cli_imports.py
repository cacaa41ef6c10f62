"""Run ``aelastic run --standalone --nproc-per-node 1 <no-op>`` in this interpreter; print,
as JSON, ``[imported in the main thread, imported in another thread, loaded optional
modules]``: the module names each :func:`aelastic.launcher._preimport.import_now` call
was given, and which of the optional agent modules (hang detection's, learned
timeouts', the file timer's) were loaded.

``cli_imports.py SCRIPT``.
"""

import json
import sys
import threading

import aelastic.launcher._preimport as preimport
from aelastic.launcher._cli import main

calls: tuple[list[str], list[str]] = ([], [])
real_import_now = preimport.import_now


def spy(names):  # type: ignore[no-untyped-def]
    names = list(names)
    calls[threading.current_thread() is not threading.main_thread()].extend(names)
    real_import_now(names)


preimport.import_now = spy
code = main(["--standalone", "--nproc-per-node", "1", sys.argv[1]])
optional = [
    m
    for m in ("aelastic.agent._hang", "aelastic.agent._learned", "aelastic.agent._file_timer")
    if m in sys.modules
]
print(json.dumps([*calls, optional]))
sys.exit(code)
