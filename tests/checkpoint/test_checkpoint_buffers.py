"""Save buffers: prepared ahead so the first save allocates nothing, page tables filled
without the GIL, and the saver's own list of its files checked before it is trusted."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

from aelastic.checkpoint import _buffer

SCRIPT = str(Path(__file__).parent / "scripts" / "buffers.py")


def _rss_kib(mm: mmap.mmap) -> int:
    """Resident KiB of ``mm``'s mapping, from /proc/self/smaps."""
    import ctypes

    anchor = ctypes.c_char.from_buffer(mm)
    start = ctypes.addressof(anchor)
    del anchor
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            inside = int(head.split("-")[0], 16) == start
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise AssertionError("mapping not found in /proc/self/smaps")


def test_map_file_fills_the_page_tables_of_the_bytes_asked_for(tmp_path: Path) -> None:
    size = 8 << 20
    fd = os.open(tmp_path / "buf", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        bare = _buffer.map_file(fd, size, 0)
        filled = _buffer.map_file(fd, size, size // 2)
        try:
            assert _rss_kib(bare) == 0
            # the first half, filled by madvise(MADV_POPULATE_WRITE) through ctypes (a
            # kernel older than 5.14 fills all of it)
            assert _rss_kib(filled) >= size // 2 // 1024
        finally:
            bare.close()
            filled.close()
    finally:
        os.close(fd)


def test_first_save_fits_the_reserved_pages_and_a_file_removed_behind_the_saver(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "AELASTIC_CHECKPOINT_DIR": str(tmp_path), "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run(
        [sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(done.stdout)
    # reserve() allocated the tensors' bytes and room for torch.save's records
    assert out["first_file"] <= out["reserved"], out
    # each of the first four saves found the next one's buffer mapped (reserve's two
    # spares, then the oldest kept step): no thread started to prepare one
    assert out["prepared"] == [False, False, False, False], out
    assert [os.path.dirname(p) for p in out["steady"]] == ["step_000000000002", "step_000000000003"]
    # step 2's file vanished: the save of 4 rescanned and kept 3 and 4
    assert [os.path.dirname(p) for p in out["after_removal"]] == [
        "step_000000000003",
        "step_000000000004",
    ]
    assert out["loaded"] == [40.0, 7.0]
