"""Slurm's hostlist grammar, expanded as ``scontrol show hostnames`` expands it.

``n[1-3,5],gpu-[01-02]`` -> ``n1 n2 n3 n5 gpu-01 gpu-02``. Items are split on commas
outside brackets (empty items are dropped, duplicates kept, order kept). An item is a
name with at most two bracket groups of comma-separated numbers or ``LOW-HIGH`` ranges;
a range is zero-padded to the width of its ``LOW`` (``[8-011]`` -> 8..11, ``[001-3]`` ->
001..003). Two groups expand as a cross product, the last group varying fastest
(``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2); text after the last group is refused, as
Slurm refuses it. Three or more groups are refused here: Slurm orders their product in a
way that is not the plain cross product, and the first host decides who hosts the store.

A plain function; bad input raises :class:`ConfigError` naming the list and the fault.
"""

from __future__ import annotations

import re

from .._exceptions import ConfigError

__all__ = ("expand_nodelist",)

# A generous bound: a typo like n[1-100000000] must fail, not fill the memory.
MAX_HOSTS = 1 << 20

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _bad(nodelist: str, why: str) -> ConfigError:
    return ConfigError(
        f"cannot expand the Slurm node list {nodelist!r}: {why}; it should look like "
        "'n[1-3,5],gpu-[01-02]' (check SLURM_JOB_NODELIST or the list you passed)"
    )


def _split_items(nodelist: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise _bad(nodelist, f"nested '[' at offset {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _bad(nodelist, f"']' without '[' at offset {i}")
        elif ch == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    if depth:
        raise _bad(nodelist, "a '[' is never closed")
    items.append(nodelist[start:])
    return [item for item in items if item]


def _numbers(nodelist: str, group: str) -> list[str]:
    out: list[str] = []
    for part in group.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise _bad(nodelist, f"{part!r} in [{group}] is not a number or LOW-HIGH range")
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise _bad(nodelist, f"the range {part!r} runs backwards")
        if high - low >= MAX_HOSTS:
            raise _bad(nodelist, f"the range {part!r} has more than {MAX_HOSTS} hosts")
        width = len(low_text)
        out.extend(str(n).zfill(width) for n in range(low, high + 1))
    return out


def _expand_item(nodelist: str, item: str) -> list[str]:
    if any(ch.isspace() for ch in item):
        raise _bad(nodelist, f"{item!r} contains white space")
    groups = list(_GROUP.finditer(item))
    if not groups:
        return [item]
    if len(groups) > 2:
        raise _bad(nodelist, f"{item!r} has {len(groups)} bracket groups (at most 2 here)")
    if groups[-1].end() != len(item):
        raise _bad(nodelist, f"{item!r} has text after its last bracket group")
    names = [""]
    last = 0
    for group in groups:
        prefix = item[last : group.start()]
        numbers = _numbers(nodelist, group.group(1))
        names = [name + prefix + number for name in names for number in numbers]
        if len(names) > MAX_HOSTS:
            raise _bad(nodelist, f"{item!r} expands to more than {MAX_HOSTS} hosts")
        last = group.end()
    return names


def expand_nodelist(nodelist: str) -> list[str]:
    """The host names of a Slurm node list, in Slurm's order; raises ``ConfigError``."""
    if not nodelist.strip():
        raise _bad(nodelist, "it is empty")
    hosts: list[str] = []
    for item in _split_items(nodelist):
        hosts.extend(_expand_item(nodelist, item))
        if len(hosts) > MAX_HOSTS:
            raise _bad(nodelist, f"it names more than {MAX_HOSTS} hosts")
    return hosts
