"""The replica-group flags' defaults are the settings classes' (stated once, there)."""

from __future__ import annotations

from aelastic.launcher._args import build_parser, parse_run_args
from aelastic.replicas._settings import LighthouseSettings, ReplicaGroups


def test_the_flags_defaults_are_read_from_the_settings() -> None:
    lighthouse = LighthouseSettings()
    helps = {a.option_strings[0]: a.help or "" for a in build_parser()._actions if a.option_strings}
    shown = {
        "--lighthouse-join-timeout": f"{lighthouse.join_timeout:g}",
        "--lighthouse-heartbeat-timeout": f"{lighthouse.heartbeat_timeout:g}",
        "--spare-replica-groups": f"{ReplicaGroups(1).spares}",
    }
    for flag, default in shown.items():
        assert helps[flag].endswith(f"(default: {default})"), helps[flag]
    groups = parse_run_args(["--replica-groups", "2", "x.py"], {}).replica_groups
    assert groups is not None and (groups.groups, groups.spares) == (2, ReplicaGroups(1).spares)
    assert groups.settings == lighthouse
