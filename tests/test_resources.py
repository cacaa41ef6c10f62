"""One way to start a resource (README, "How to start a resource in aelastic").

A long-lived resource (the store server, every rendezvous handler) is an
``anyio.AsyncContextManagerMixin``: its start and stop are one
``__asynccontextmanager__`` whose task groups and exit stacks are entered with
``async with``. The source is read with :mod:`ast` for the two ways this used to go
wrong: a task group created outside an ``async with``, and ``__aenter__`` /
``__aexit__`` called by hand.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from anyio import AsyncContextManagerMixin

import aelastic
from aelastic.rendezvous import RendezvousHandler
from aelastic.rendezvous._c10d import C10dRendezvousHandler
from aelastic.rendezvous._dynamic import DynamicRendezvousHandler
from aelastic.rendezvous._static import StaticRendezvousHandler
from aelastic.rendezvous.etcd import EtcdRendezvousHandler
from aelastic.store import StoreServer

ROOT = Path(aelastic.__file__).parent

#: module -> why it calls ``__aenter__`` / ``__aexit__`` by hand (the list only shrinks).
ALLOWED_HAND_ENTRY = {
    "store/_server.py": "StoreServer.start(), the shim for code that cannot nest",
}

#: Classes with an ``__aenter__`` of their own: simple resources that start no task
#: (anyio's AsyncResource shape: ``__aenter__`` returns self, ``__aexit__`` closes).
SIMPLE_RESOURCES = {
    ("events/_subscribe.py", "EventStream"),  # attaches a subscription, no task
    ("store/_client.py", "TCPStoreClient"),  # connects; its connections own no task
    ("rendezvous/etcd/_client.py", "EtcdWatch"),  # closes its gRPC call
}


def _trees() -> dict[str, ast.Module]:
    return {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(ROOT.rglob("*.py"))
    }


TREES = _trees()


@pytest.mark.parametrize(
    "cls",
    [
        StoreServer,
        RendezvousHandler,
        StaticRendezvousHandler,
        DynamicRendezvousHandler,
        C10dRendezvousHandler,
        EtcdRendezvousHandler,
    ],
)
def test_long_lived_resources_start_one_way(cls: type) -> None:
    assert issubclass(cls, AsyncContextManagerMixin)
    # entered and left only through their __asynccontextmanager__
    assert cls.__aenter__ is AsyncContextManagerMixin.__aenter__
    assert cls.__aexit__ is AsyncContextManagerMixin.__aexit__


def test_task_groups_are_entered_with_async_with() -> None:
    found = []
    for module, tree in TREES.items():
        entered = {
            id(item.context_expr)
            for node in ast.walk(tree)
            if isinstance(node, ast.AsyncWith)
            for item in node.items
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "create_task_group"
                and id(node) not in entered
            ):
                found.append(f"{module}:{node.lineno}")
    assert not found, f"task groups created outside 'async with': {found}"


def test_no_hand_entered_context_managers() -> None:
    found = set()
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("__aenter__", "__aexit__")
            ):
                found.add(module)
    assert found == set(ALLOWED_HAND_ENTRY), (
        "__aenter__/__aexit__ called by hand outside the allowed shims: "
        f"{sorted(found - set(ALLOWED_HAND_ENTRY))}; fixed (drop from the list): "
        f"{sorted(set(ALLOWED_HAND_ENTRY) - found)}"
    )


def test_own_aenter_only_on_simple_resources() -> None:
    found = {
        (module, node.name)
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(item, ast.AsyncFunctionDef) and item.name == "__aenter__"
            for item in node.body
        )
    }
    assert found == SIMPLE_RESOURCES, (
        "a class with its own __aenter__ that is not a known simple resource: "
        f"{sorted(found - SIMPLE_RESOURCES)} (a resource that runs tasks implements "
        "__asynccontextmanager__ with anyio.AsyncContextManagerMixin)"
    )
