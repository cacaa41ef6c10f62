"""Read the ``ChildFailedError`` summary a launcher (aelastic or torchrun) printed on stderr."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENTRY = re.compile(r"^\[\d+\]:$", re.MULTILINE)
_FIELD = re.compile(r"^  (\w+)\s*: ?(.*)$")


@dataclass(frozen=True)
class Entry:
    """One failure of the summary; ``root`` for the root cause (printed last)."""

    root: bool
    rank: int
    local_rank: int
    exitcode: int
    error_file: str
    traceback: str


def summary_block(stderr: str) -> str:
    """The text between the summary's first and last ``====`` borders (fails if absent)."""
    lines = stderr.splitlines()
    title = next((i for i, line in enumerate(lines) if line.endswith(" FAILED") and i > 0), None)
    assert title is not None and set(lines[title - 1]) == {"="}, f"no summary in:\n{stderr}"
    end = next(i for i in range(title + 1, len(lines)) if lines[i] and set(lines[i]) == {"="})
    return "\n".join(lines[title - 1 : end + 1])


def _entry(text: str, root: bool) -> Entry:
    fields: dict[str, str] = {}
    trace: list[str] | None = None  # the traceback is the last field and runs on
    for line in text.strip("\n").splitlines():
        match = _FIELD.match(line)
        if trace is not None:
            trace.append(line)
        elif match is not None and match.group(1) == "traceback":
            trace = [match.group(2)]
        elif match is not None:
            fields[match.group(1)] = match.group(2).strip()
    ranks = re.fullmatch(r"(\d+) \(local_rank: (\d+)\)", fields["rank"])
    assert ranks is not None, text
    rank, local = ranks.groups()
    return Entry(
        root=root,
        rank=int(rank),
        local_rank=int(local),
        exitcode=int(fields["exitcode"].split()[0]),
        error_file=fields["error_file"],
        traceback="\n".join(trace or []).rstrip(),  # torch ends it with "\n  "
    )


def summary_entries(stderr: str) -> list[Entry]:
    """Every failure listed in the summary, the root cause last."""
    block = summary_block(stderr)
    others, _, root = block.partition("Root Cause (first observed failure):")
    entries = []
    for part, is_root in ((others, False), (root, True)):
        chunks = _ENTRY.split(part)[1:]
        entries += [_entry(chunk.split("\n---")[0].split("\n===")[0], is_root) for chunk in chunks]
    return entries
