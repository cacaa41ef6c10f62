"""``python _lighthouse_main.py OPTIONS``: torchft's Lighthouse without importing torch.

torchft's ``torchft_lighthouse`` script imports ``torchft._torchft``, which runs the
``torchft`` package first, and that imports torch: seconds per (re)start, 15 s on a
loaded host. The Lighthouse itself is in the Rust extension; this loads that file
alone (found without running the package) and calls its ``lighthouse_main``, which
reads this process's arguments. Run as a file (not ``-m``): the Lighthouse parses
``argv`` from its second word on. Exits 3 when the extension is not found.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def main() -> int:
    spec = importlib.util.find_spec("torchft")  # finds the package, does not run it
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if name.startswith("_torchft.") and name.endswith((".so", ".pyd")):
                ext = importlib.util.spec_from_file_location(
                    "torchft._torchft", os.path.join(folder, name)
                )
                assert ext is not None and ext.loader is not None
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                code: int = module.lighthouse_main()
                return code
    print("torchft's _torchft extension not found", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
