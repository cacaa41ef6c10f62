"""Run ``aelastic run --standalone --nproc-per-node 1 <no-op>`` in this interpreter; print,
as JSON, ``[imported in the main thread, imported in another thread]``: the module
names each :func:`aelastic.launcher._preimport.import_now` call was given.

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
print(json.dumps(calls))
sys.exit(code)
