"""Run one no-op job with ``open_job`` in a fresh interpreter; print, as JSON,
``{"on_loop": aelastic modules imported on the event loop's thread after the service
started, "optional": which of the optional agent modules (hang detection's, learned
timeouts', the file timer's) were loaded}``.

``loop_imports.py BACKEND [hang]`` (asyncio, trio; ``hang``: with a heartbeat timeout).
"""

import importlib.abc
import json
import sys
import threading

import anyio

from aelastic import LaunchConfig, open_job
from aelastic.progress._settings import HangSettings

MAIN = threading.main_thread()
on_loop: list[str] = []


class _Recorder(importlib.abc.MetaPathFinder):
    """Records which aelastic modules start importing on the main thread (the loop's)."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name.startswith("aelastic") and threading.current_thread() is MAIN:
            on_loop.append(name)
        return None  # the real finders import it


async def main() -> None:
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        run_id="imports",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        hangs=HangSettings(heartbeat_timeout=60.0 if sys.argv[2:] == ["hang"] else None),
    )
    sys.meta_path.insert(0, _Recorder())
    async with open_job(config, "/bin/true") as job:
        await job.wait()


anyio.run(main, backend=sys.argv[1])
optional = [
    m
    for m in ("aelastic.agent._hang", "aelastic.agent._learned", "aelastic.agent._file_timer")
    if m in sys.modules
]
print(json.dumps({"on_loop": on_loop, "optional": optional}))
