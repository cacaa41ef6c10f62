"""``Std``: which standard streams to redirect or tee (torch's flag and its parsers)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import IntFlag

from .._exceptions import ConfigError

__all__ = ("Std", "parse_std_spec", "to_map")

_VALUE_RE = re.compile(r"^\s*[0-3]\s*$")
_MAPPING_RE = re.compile(r"^\s*\d+\s*:\s*[0-3]\s*(,\s*\d+\s*:\s*[0-3]\s*)*$")
_RULE = (
    'expected one of "0" (none), "1" (stdout), "2" (stderr), "3" (both), or a per-local-rank'
    ' mapping such as "0:3,1:0"'
)


class Std(IntFlag):
    """Standard streams: ``NONE=0``, ``OUT=1``, ``ERR=2``, ``ALL=3`` (torch's values)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def from_str(cls, vm: str) -> Std | dict[int, Std]:
        """``"3"`` -> ``Std.ALL``; ``"0:3,1:0"`` -> ``{0: Std.ALL, 1: Std.NONE}``.

        Raises ValueError naming the accepted forms for anything else.
        """
        if _VALUE_RE.match(vm):
            return cls(int(vm))
        if _MAPPING_RE.match(vm):
            result: dict[int, Std] = {}
            for item in vm.split(","):
                rank_s, value_s = item.split(":")
                rank = int(rank_s)
                if rank in result:
                    raise ConfigError(f"redirect/tee value {vm!r} names local rank {rank} twice")
                result[rank] = cls(int(value_s))
            return result
        raise ConfigError(f"invalid redirect/tee value {vm!r}: {_RULE}")


def to_map(
    val_or_map: Std | int | str | Mapping[int, Std], local_world_size: int
) -> dict[int, Std]:
    """Expand to ``{local_rank: Std}`` for every rank; unnamed ranks get ``Std.NONE``.

    Accepts a ``Std`` (or its int), a CLI string (``"3"``, ``"0:1,1:2"``) or a
    mapping. Raises ValueError for a bad value or a local rank outside
    ``0..local_world_size-1``.
    """
    if local_world_size <= 0:
        raise ConfigError(f"local_world_size must be positive, got {local_world_size}")
    if isinstance(val_or_map, str):
        val_or_map = Std.from_str(val_or_map)
    if isinstance(val_or_map, int) and not 0 <= val_or_map <= 3:
        raise ConfigError(f"invalid redirect/tee value {val_or_map!r}: {_RULE}")
    if isinstance(val_or_map, Mapping):
        bad = sorted(r for r in val_or_map if not 0 <= r < local_world_size)
        if bad:
            raise ConfigError(
                f"redirect/tee mapping names local rank(s) {bad}, but only local ranks"
                f" 0..{local_world_size - 1} exist (local_world_size={local_world_size})"
            )
        return {r: Std(val_or_map.get(r, Std.NONE)) for r in range(local_world_size)}
    return dict.fromkeys(range(local_world_size), Std(val_or_map))


def parse_std_spec(value: str, local_world_size: int) -> dict[int, Std]:
    """Parse a ``--redirects`` / ``--tee`` value into ``{local_rank: Std}`` for every rank."""
    return to_map(Std.from_str(value), local_world_size)
