"""Copying a step from the agent's memory to ``--checkpoint-dir``: blocking, run in a thread.

The agent never imports torch: the rank files are already ``torch.save`` bytes, so a
copy is a ``sendfile`` per rank. Each file is written to a temporary name, fsynced
and renamed; ``manifest.json`` (format, step, world size, files) is replaced once the
step holds every rank of its world, and only then are older steps removed. So the
directory always holds a whole step, readable without aelastic::

    manifest = json.load(open(f"{DIR}/manifest.json"))
    obj = torch.load(f"{DIR}/{manifest['files']['0']}", weights_only=True)

A step saved through ``torch.distributed.checkpoint`` (``MemoryWriter``) carries DCP's
``.metadata`` (copied from the node that holds it, the coordinator's), and the manifest
says ``"dcp": true``: ``dcp.load(state_dict, checkpoint_id=f"{DIR}/{manifest['dir']}")``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import TYPE_CHECKING

from . import _layout as L
from ._exceptions import CheckpointError

if TYPE_CHECKING:
    from ._settings import CheckpointSettings

__all__ = ("MANIFEST", "check_paths", "check_writable", "write_step")

MANIFEST = "manifest.json"


def check_writable(directory: str) -> None:
    """Create ``directory`` if needed and prove it writable, or raise :class:`CheckpointError`."""
    probe = os.path.join(directory, f".aelastic_probe.{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise CheckpointError(
            f"{directory}: not a writable directory ({exc.strerror}); "
            "pass a directory this user can create files in"
        ) from None


def check_paths(settings: CheckpointSettings) -> None:
    """Check the files ``settings`` names before a job starts: the directory is created
    and proven writable, the secret file read. Blocking (run it in a thread); the
    launcher calls it when a job starts (``open_job``), for the CLI and the API alike.

    Raises:
        CheckpointError: one line starting with the flag (``--checkpoint-dir PATH: ...``,
            ``--job-secret-file PATH: ...``) and ending with the fix.
    """
    if settings.dir is not None:
        try:
            check_writable(settings.dir)
        except CheckpointError as exc:
            raise CheckpointError(f"--checkpoint-dir {exc}") from None
    if settings.job_secret_file is not None:
        from ._peerauth import read_key_file

        try:
            read_key_file(settings.job_secret_file)
        except ValueError as exc:
            raise CheckpointError(f"--job-secret-file {exc}") from None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Reused(Exception):
    """A worker took the source file over for a newer save while it was copied."""


def _copy(src_fd: int, src: str, dest: str) -> int:
    """Write ``src_fd``'s bytes to ``dest`` atomically (temporary file, fsync, rename).

    Raises :class:`_Reused` (and writes nothing) when ``src`` no longer names the
    file copied: a worker's ``save`` renames its oldest step's file away before it
    overwrites it, so a name still in place after the copy means the bytes were whole.
    """
    tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.{os.getpid()}.tmp")
    size = os.fstat(src_fd).st_size
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        while offset < size:
            sent = os.sendfile(out, src_fd, offset, size - offset)
            if sent == 0:
                break
            offset += sent
        os.fsync(out)
        try:
            same = os.stat(src).st_ino == os.fstat(src_fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise _Reused(src)
    except BaseException:
        os.close(out)
        os.unlink(tmp)
        raise
    os.close(out)
    os.replace(tmp, dest)
    return size


def write_step(memory_dir: str, disk_dir: str, step: int, world: int, ranks: list[int]) -> int:
    """Copy ``ranks``' files of ``step`` to ``disk_dir``; return the bytes written (0: the
    workers pruned or reused the step meanwhile; its files written so far stay, whole,
    but it is not committed).

    Raises:
        CheckpointError: the disk refused a write (full, read-only); whatever step
            ``disk_dir`` held before is intact.
    """
    sources: dict[int, int] = {}
    try:
        # Opened first: a worker pruning the step meanwhile cannot take the bytes away.
        for rank in ranks:
            sources[rank] = os.open(L.rank_file(memory_dir, step, rank, world), os.O_RDONLY)
    except FileNotFoundError:
        for fd in sources.values():
            os.close(fd)
        return 0
    try:
        directory = L.step_dir(disk_dir, step)
        os.makedirs(directory, exist_ok=True)
        total = sum(
            _copy(
                fd,
                L.rank_file(memory_dir, step, rank, world),
                L.rank_file(disk_dir, step, rank, world),
            )
            for rank, fd in sources.items()
        )
        total += _copy_metadata(L.step_dir(memory_dir, step), directory)
        _fsync_dir(directory)
        _commit(disk_dir, step, ranks)
    except _Reused:  # the workers moved on meanwhile: the next copy takes a newer step
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # if this was its only file
        return 0
    except OSError as exc:
        raise CheckpointError(
            f"cannot write step {step} to --checkpoint-dir {disk_dir}: {exc}; the step it "
            "held before is intact"
        ) from None
    finally:
        for fd in sources.values():
            os.close(fd)
    return total


def _copy_metadata(source: str, directory: str) -> int:
    """Copy a DCP step's ``.metadata`` (where this node holds it); its bytes."""
    try:
        fd = os.open(os.path.join(source, L.METADATA), os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        return _copy(fd, os.path.join(source, L.METADATA), os.path.join(directory, L.METADATA))
    finally:
        os.close(fd)


def _commit(disk_dir: str, step: int, ranks: list[int]) -> None:
    """Point the manifest at ``step`` once it is whole, then remove the older steps.

    A step another node still writes (a shared ``disk_dir``) is not whole yet: then only
    this node's files of all but its two newest steps go.
    """
    steps = L.scan(disk_dir)
    whole = L.complete_steps(steps, (), whole_world=True)
    if step in whole:
        world = whole[step]
        dcp = os.path.exists(os.path.join(L.step_dir(disk_dir, step), L.METADATA))
        manifest = {
            "format": (
                "torch.distributed.checkpoint: dcp.load(state_dict, checkpoint_id=<dir>)"
                if dcp
                else "torch.save, one file per global rank: torch.load(path, weights_only=True)"
            ),
            "dcp": dcp,
            "dir": os.path.basename(L.step_dir(disk_dir, step)),
            "step": step,
            "world_size": world,
            "files": {
                str(r): os.path.relpath(L.rank_file(disk_dir, step, r, world), disk_dir)
                for r in range(world)
            },
        }
        tmp = os.path.join(disk_dir, f".{MANIFEST}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(disk_dir, MANIFEST))
        _fsync_dir(disk_dir)
        for old in steps:
            if old < step:
                shutil.rmtree(L.step_dir(disk_dir, old), ignore_errors=True)
        return
    L.prune(disk_dir, set(ranks))
