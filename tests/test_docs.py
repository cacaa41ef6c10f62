"""The README and ``docs/`` stay true: their links resolve, their commands parse.

Every relative link in ``README.md``, ``docs/*.md`` and ``examples/README.md`` must name a
file of the repository, and every ``python -m aelastic ...`` command in their fenced code
blocks must be accepted by that command's own parser (nothing is started).
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from aelastic.cli import COMMANDS
from aelastic.events import _cli as events_cli
from aelastic.jobview import _cli as jobview_cli
from aelastic.launcher._args import parse_run_args
from aelastic.store import _cli as store_cli

REPO = Path(__file__).parents[1]
DOCS = [REPO / "README.md", REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SUBSTITUTION = re.compile(r"\$\([^)]*\)")
#: a command line: ``[VAR=value ...] python -m aelastic ARGS`` (not a log line quoting one)
_COMMAND = re.compile(r"^\s*(?:\w+=\S+\s+)*python -m aelastic (.*)$")


def _parsed(parser: Callable[[], argparse.ArgumentParser]) -> Callable[[list[str]], object]:
    return lambda argv: parser().parse_args(argv)


#: command -> a function that parses its argv and raises (or exits) when it is refused
PARSERS: dict[str, Callable[[list[str]], object]] = {
    "run": lambda argv: parse_run_args(argv, {}),
    "store": _parsed(store_cli._build_parser),
    "events": _parsed(events_cli._build_parser),
    "status": _parsed(jobview_cli.status_parser),
    "dashboard": _parsed(jobview_cli.dashboard_parser),
}


def _links() -> Iterator[tuple[Path, str]]:
    for doc in DOCS:
        for target in _LINK.findall(doc.read_text()):
            if "://" not in target and not target.startswith(("#", "mailto:")):
                yield doc, target


def _commands() -> Iterator[tuple[Path, str]]:
    for doc in DOCS:
        for block in _FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                shown = _COMMAND.match(line)
                if shown:
                    yield doc, shown.group(1)


def _ids(pairs: Sequence[tuple[Path, str]]) -> list[str]:
    return [f"{doc.relative_to(REPO)}:{text[:40]}" for doc, text in pairs]


LINKS = list(_links())
SHOWN = list(_commands())


def test_the_docs_show_links_and_commands() -> None:
    assert len(LINKS) >= 10 and len(SHOWN) >= 10  # the extraction itself works
    assert set(PARSERS) == set(COMMANDS)  # a new command gets a parser here


@pytest.mark.parametrize(("doc", "target"), LINKS, ids=_ids(LINKS))
def test_relative_link_resolves(doc: Path, target: str) -> None:
    path = (doc.parent / target.split("#", 1)[0]).resolve()
    assert path.exists(), f"{doc.relative_to(REPO)} links to {target}, which does not exist"


@pytest.mark.parametrize(("doc", "command"), SHOWN, ids=_ids(SHOWN))
def test_shown_command_is_accepted(doc: Path, command: str) -> None:
    words = shlex.split(_SUBSTITUTION.sub("X", command.split(" #", 1)[0]))
    name, argv = words[0], words[1:]
    assert name in PARSERS, f"{doc.relative_to(REPO)} shows an unknown command {name!r}"
    try:
        PARSERS[name](argv)
    except SystemExit as exc:  # argparse's own refusal
        pytest.fail(f"{doc.relative_to(REPO)}: `{command}` is refused (exit {exc.code})")


def test_a_refused_command_is_caught() -> None:
    with pytest.raises((SystemExit, ValueError)):
        PARSERS["run"](["--nnodes", "two", "train.py"])
    with pytest.raises(SystemExit):
        PARSERS["status"](["--rdzv-id", "job"])
