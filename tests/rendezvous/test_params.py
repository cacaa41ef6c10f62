"""RendezvousParameters, endpoint parsing and the backend registry."""

from __future__ import annotations

import pytest

from aelastic import AelasticError
from aelastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aelastic.rendezvous._c10d import C10dRendezvousHandler
from aelastic.rendezvous._dynamic import DynamicRendezvousHandler
from aelastic.rendezvous._exceptions import RendezvousConfigError
from aelastic.rendezvous._params import parse_endpoint
from aelastic.rendezvous._registry import RendezvousHandlerRegistry, create_handler
from aelastic.rendezvous._static import StaticRendezvousHandler
from aelastic.store import LocalStore


def params(**kw: object) -> RendezvousParameters:
    base: dict[str, object] = dict(
        backend="c10d", endpoint="127.0.0.1:1", run_id="r", min_nodes=1, max_nodes=2
    )
    base.update(kw)
    return RendezvousParameters(**base)  # type: ignore[arg-type]


def test_min_greater_than_max_names_both() -> None:
    with pytest.raises(ValueError, match=r"min_nodes \(3\) must not exceed max_nodes \(2\)"):
        params(min_nodes=3, max_nodes=2)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"min_nodes": 0}, "min_nodes"),
        ({"max_nodes": "2"}, "max_nodes"),
        ({"run_id": ""}, "run_id"),
        ({"run_id": "a/b"}, "run_id"),
        ({"backend": " "}, "backend"),
    ],
)
def test_bad_parameters(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        params(**kw)


def test_config_accessors() -> None:
    p = params(a="yes", b="0", c="12", d="0.25", e="maybe")
    assert p.get("missing", 7) == 7
    assert p.get_as_bool("a") is True
    assert p.get_as_bool("b") is False
    assert p.get_as_bool("missing") is None
    assert p.get_as_int("c") == 12
    assert p.get_as_float("d") == 0.25
    with pytest.raises(ValueError, match="e='maybe' is not a boolean"):
        p.get_as_bool("e")
    with pytest.raises(ValueError, match="not an integer"):
        p.get_as_int("d")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("host", ("host", 29400)),
        ("host:123", ("host", 123)),
        ("10.0.0.1:5", ("10.0.0.1", 5)),
        ("[::1]:77", ("::1", 77)),
        ("[::1]", ("::1", 29400)),
        ("fe80::1", ("fe80::1", 29400)),
        ("", ("localhost", 29400)),  # torch's default: localhost
        ("  ", ("localhost", 29400)),
        ("my_host-1.example.com:7", ("my_host-1.example.com", 7)),
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text, 29400) == expected


@pytest.mark.parametrize(
    "text",
    [
        "host:x",
        "host:70000",
        "[::1",
        ":5",
        "a:b:c",
        "[host]:5",
        "1:2:3:4:5:6:7:8:9",
        # refused by torch's parse_rendezvous_endpoint too
        "~",
        "~:123",
        "dummy.com :123",
        "dummy.com:",
    ],
)
def test_parse_endpoint_rejects(text: str) -> None:
    with pytest.raises(RendezvousConfigError, match="endpoint"):
        parse_endpoint(text, 29400)


def test_endpoint_with_several_colons_fails_at_once_naming_the_fix() -> None:
    # Before: "a:b:c" was taken for an IPv6 address and its resolution retried for 60 s.
    with pytest.raises(RendezvousConfigError, match=r"'a:b:c'.*\[ipv6\]:port"):
        create_handler(params(endpoint="a:b:c"))


def test_parse_endpoint_requires_port_without_default() -> None:
    with pytest.raises(RendezvousError, match="has no port"):
        parse_endpoint("host", None)
    with pytest.raises(RendezvousConfigError, match="empty"):
        parse_endpoint("", None)


def test_parse_endpoint_messages_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"host '~' is not a host name"):
        parse_endpoint("~:123", 29400)
    with pytest.raises(ValueError, match=r"host 'dummy.com ' is not a host name"):
        parse_endpoint("dummy.com :123", 29400)
    with pytest.raises(ValueError, match=r"ends with ':' but names no port"):
        parse_endpoint("dummy.com:", 29400)


def test_registry_builtins_and_alias() -> None:
    assert isinstance(get_rendezvous_handler(params(backend="tcp")), C10dRendezvousHandler)
    handler = create_handler(params(backend="c10d", keep_alive_interval="0.5"))
    assert isinstance(handler, C10dRendezvousHandler)
    assert handler.get_backend() == "c10d"
    assert handler.settings.keep_alive_interval == 0.5
    assert handler.settings.heartbeat_timeout == 1.5
    assert handler.use_agent_store
    static = create_handler(params(backend="static", rank=1, min_nodes=2))
    assert isinstance(static, StaticRendezvousHandler)
    assert static.get_backend() == "static"


def test_registry_unknown_backend_lists_choices() -> None:
    with pytest.raises(RendezvousError, match=r"unknown rendezvous backend 'nope'.*c10d"):
        create_handler(params(backend="nope"))
    # a configuration error: a ValueError, as the README's rule says (torch: ValueError)
    with pytest.raises(RendezvousConfigError):
        create_handler(params(backend="nope"))
    with pytest.raises(ValueError):
        get_rendezvous_handler(params(backend="nope"))


def test_registry_with_no_backend_says_none_is_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aelastic.rendezvous import _registry

    monkeypatch.setattr(_registry, "entry_points", lambda group: [])  # no plugin installed
    empty = _registry.RendezvousHandlerRegistry()
    with pytest.raises(RendezvousConfigError) as info:
        empty.create_handler(params(backend="c10d"))
    text = str(info.value)
    assert "no rendezvous backend is registered" in text
    assert "choose one of" not in text  # not an empty list of choices
    assert "register('c10d', factory)" in text and "'aelastic.rendezvous'" in text
    empty.register("mine", lambda p: create_handler(params()))
    with pytest.raises(RendezvousConfigError, match=r"choose one of mine \(--rdzv-backend\)"):
        empty.create_handler(params(backend="c10d"))


def test_invalid_c10d_store_type_is_a_config_error() -> None:
    with pytest.raises(RendezvousConfigError, match=r"store_type='file'.*store_type=tcp"):
        create_handler(params(store_type="file"))
    assert isinstance(create_handler(params(store_type="TCP")), C10dRendezvousHandler)


def test_static_needs_rank_and_fixed_world() -> None:
    with pytest.raises(ValueError, match="--node-rank"):
        create_handler(params(backend="static", min_nodes=2))
    with pytest.raises(ValueError, match="fixed world"):
        create_handler(params(backend="static", rank=0))
    with pytest.raises(ValueError, match="out of range"):
        create_handler(params(backend="static", rank=2, min_nodes=2))


def test_bad_dynamic_config_is_named() -> None:
    with pytest.raises(RendezvousConfigError, match="join_timeout"):
        create_handler(params(join_timeout="soon"))
    with pytest.raises(RendezvousConfigError, match="keep_alive_interval"):
        create_handler(params(keep_alive_interval=0))
    with pytest.raises(RendezvousConfigError, match="keep_alive_max_attempt"):
        create_handler(params(keep_alive_max_attempt=0))
    with pytest.raises(RendezvousConfigError, match="--nnodes MIN:MAX"):
        DynamicRendezvousHandler("run", 3, 2, store=LocalStore())
    assert issubclass(RendezvousConfigError, (AelasticError, ValueError))


def test_register_plugin_and_conflict() -> None:
    registry = RendezvousHandlerRegistry()

    def factory(p: RendezvousParameters) -> RendezvousHandler:
        return StaticRendezvousHandler(p)

    registry.register("static", factory)
    registry.register("static", factory)  # same factory: no-op
    with pytest.raises(ValueError, match="already registered"):
        registry.register("static", lambda p: StaticRendezvousHandler(p))
    registry.register("mine", factory)
    with pytest.raises(RendezvousConfigError, match="reports backend 'static'"):
        registry.create_handler(params(backend="mine", rank=0, min_nodes=2))


def test_plugins_load_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import aelastic.rendezvous._registry as registry_module

    eps = [
        EntryPoint("mystatic", "aelastic.rendezvous._static:StaticRendezvousHandler", "x"),
        EntryPoint("broken", "no.such.module:factory", "x"),
    ]
    monkeypatch.setattr(
        registry_module, "entry_points", lambda group: eps if group == "aelastic.rendezvous" else []
    )
    registry = RendezvousHandlerRegistry()
    with pytest.raises(ValueError, match="reports backend 'static'"):
        # Loaded on first use; the handler must report the plugin's own name.
        registry.create_handler(params(backend="mystatic", rank=0, min_nodes=2))
    assert "mystatic" in registry.names() and "broken" not in registry.names()
