"""Issue 40 item 2: a worker's descriptors against torchrun's, ground truth from torchrun.

A real agent (``python -m aelastic run``, warm workers) and torchrun itself
(``python -m torch.distributed.run``) each run one worker that lists its own
``/proc/self/fd``, and that of a child it forks. The one documented difference
(docs/differences.md: the warm worker's script-ended channel, a socket) is there in the
worker, and in nothing else; a forked child holds exactly what torchrun's holds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

LIST_FDS = """\
import json, os, sys

def fds():
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out

mine = fds()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    child = fds()
    child.pop(str(write), None)
    os.write(write, json.dumps(child).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read, "rb") as f:
    child = json.loads(f.read())
os.waitpid(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"worker": mine, "child": child}, f)
"""


def _kinds(fds: dict[str, str]) -> dict[int, str]:
    """{fd: kind}: ``pipe``, ``socket`` or the path (inode numbers differ between runs)."""
    return {int(n): re.sub(r":\[\d+\]$", "", target) for n, target in fds.items()}


def _run(launcher: list[str], tmp_path: Path, name: str) -> dict[str, dict[int, str]]:
    script = tmp_path / "list_fds.py"
    script.write_text(LIST_FDS)
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k != "AELASTIC_WARM_WORKERS"}
    command = [*launcher, "--standalone", "--nproc-per-node", "1", str(script), str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", *command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return {k: _kinds(v) for k, v in json.loads(out.read_text()).items()}


def test_a_worker_holds_torchruns_descriptors_and_the_channel_only(tmp_path: Path) -> None:
    torchrun = _run(["torch.distributed.run"], tmp_path, "torchrun")
    ours = _run(["aelastic", "run"], tmp_path, "aelastic")
    assert torchrun["worker"][0] == ours["worker"][0] == "/dev/null"
    extra = {fd: kind for fd, kind in ours["worker"].items() if fd not in torchrun["worker"]}
    assert list(extra.values()) == ["socket"]  # the script-ended channel, documented
    assert {fd: k for fd, k in ours["worker"].items() if fd not in extra} == torchrun["worker"]
    # a forked child holds what torchrun's forked child holds: not the channel
    assert ours["child"] == torchrun["child"] == torchrun["worker"]


REUSE_THE_CHANNELS_NUMBER = """\
import atexit, os, sys
def kind(n):
    try:
        return os.readlink(f"/proc/self/fd/{n}")
    except OSError:  # the listing's own descriptor
        return ""
(channel,) = [int(n) for n in os.listdir("/proc/self/fd") if kind(n).startswith("socket:")]
os.closerange(3, channel + 1)  # as a daemonizing script does; then reuses the numbers
opened = [os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND) for _ in range(channel - 2)]
assert opened[-1] == channel, opened
# runs after the bootstrap's end-of-script notice: the file must still be open and ours
atexit.register(lambda: os.write(channel, b"still mine\\n"))
"""


def test_a_script_that_closed_and_reused_the_channels_number_keeps_its_file(
    tmp_path: Path,
) -> None:
    """The bootstrap neither writes ``exit 0`` into nor closes a file that took the
    channel's number after the script closed it (``os.closerange``)."""
    script = tmp_path / "reuse.py"
    script.write_text(REUSE_THE_CHANNELS_NUMBER)
    target = tmp_path / "mine.txt"
    env = {k: v for k, v in os.environ.items() if k != "AELASTIC_WARM_WORKERS"}
    command = ["aelastic", "run", "--standalone", "--nproc-per-node", "1", str(script)]
    proc = subprocess.run(
        [sys.executable, "-m", *command, str(target)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert target.read_bytes() == b"still mine\n"
