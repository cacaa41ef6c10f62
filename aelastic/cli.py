"""``python -m aelastic <command>``: dispatch to the command's own module.

Each command module exposes ``main(argv: list[str]) -> int`` and owns its argument
parsing, so importing the CLI costs only the chosen command's imports (never torch).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ("main",)

#: command name -> (module implementing ``main(argv)``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("aelastic.launcher._cli", "launch a distributed job (a drop-in for torchrun)"),
    "store": ("aelastic.store._cli", "serve a standalone TCPStore-compatible key-value store"),
    "events": ("aelastic.events._cli", "print a run's events from a store"),
    "status": ("aelastic.jobview._status_cli", "show every node of a run: state, step, restarts"),
    "dashboard": ("aelastic.jobview._dashboard_cli", "serve a run's live page with charts"),
}


def _usage() -> str:
    lines = ["usage: python -m aelastic <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines.append("\nRun 'python -m aelastic <command> --help' for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named by ``argv[0]``; return the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(
            f"aelastic: unknown command {name!r}; choose one of {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    code: int = module.main(rest)
    return code
