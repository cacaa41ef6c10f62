"""Backend registry: name -> factory, with built-ins, aliases and entry-point plugins."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ._exceptions import RendezvousConfigError, RendezvousError
from ._handler import RendezvousHandler
from ._params import RendezvousParameters

__all__ = (
    "ENTRY_POINT_GROUP",
    "HandlerFactory",
    "RendezvousHandlerRegistry",
    "rendezvous_handler_registry",
    "register",
    "create_handler",
    "get_rendezvous_handler",
)

#: Out-of-tree backends: ``[project.entry-points."aelastic.rendezvous"] name = "pkg.mod:factory"``
#: where ``factory(params: RendezvousParameters) -> RendezvousHandler``.
ENTRY_POINT_GROUP = "aelastic.rendezvous"

HandlerFactory = Callable[[RendezvousParameters], RendezvousHandler]

_log = logging.getLogger("aelastic.rendezvous")


def entry_points(*, group: str) -> Any:
    """``importlib.metadata.entry_points``, imported on first use (~20 ms of every start)."""
    from importlib.metadata import entry_points as _entry_points

    return _entry_points(group=group)


def _c10d(params: RendezvousParameters) -> RendezvousHandler:
    from ._c10d import create_c10d_handler

    return create_c10d_handler(params)


def _static(params: RendezvousParameters) -> RendezvousHandler:
    from ._static import create_static_handler

    return create_static_handler(params)


def _etcd(params: RendezvousParameters) -> RendezvousHandler:
    try:
        from .etcd._backend import create_etcd_handler
    except ImportError as exc:
        raise RendezvousError(
            f"the {params.backend!r} rendezvous backend is unavailable ({exc}); install "
            "aelastic[etcd] or use --rdzv-backend c10d"
        ) from exc
    return create_etcd_handler(params)


class RendezvousHandlerRegistry:
    """Maps backend names to handler factories.

    Aliases resolve to a canonical name (``tcp`` -> ``c10d``); ``create_handler`` checks
    that the handler reports that canonical name. Plugins from the entry-point group
    :data:`ENTRY_POINT_GROUP` are loaded the first time an unknown name is asked for.
    """

    def __init__(self) -> None:
        self._factories: dict[str, HandlerFactory] = {}
        self._aliases: dict[str, str] = {}
        self._plugins_loaded = False
        self._lock = threading.Lock()

    def register(self, name: str, factory: HandlerFactory) -> None:
        """Register ``factory`` under ``name``; re-registering the same factory is a no-op.

        Raises RendezvousConfigError if a different factory already owns ``name``.
        """
        with self._lock:
            current = self._factories.get(name)
            if current is not None and current is not factory:
                raise RendezvousConfigError(
                    f"rendezvous backend {name!r} is already registered to {current!r}"
                )
            self._factories[name] = factory

    def alias(self, name: str, target: str) -> None:
        """Make ``name`` another name of backend ``target``."""
        self._aliases[name] = target

    def names(self) -> list[str]:
        """Every registered backend name and alias, sorted."""
        return sorted({*self._factories, *self._aliases})

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in self._factories:
                continue
            try:
                factory = ep.load()
            except Exception as exc:
                _log.warning("cannot load rendezvous plugin %r (%s): %s", ep.name, ep.value, exc)
                continue
            if not callable(factory):
                _log.warning("rendezvous plugin %r (%s) is not callable", ep.name, ep.value)
                continue
            self.register(ep.name, factory)

    def _resolve(self, backend: str) -> tuple[str, HandlerFactory]:
        name = self._aliases.get(backend, backend)
        factory = self._factories.get(name)
        if factory is None:
            self._load_plugins()
            factory = self._factories.get(name)
        if factory is None:
            raise RendezvousConfigError(_unknown_backend(backend, self.names()))
        return name, factory

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        """Build the handler of ``params.backend``.

        Raises RendezvousConfigError (a ``ValueError``) for an unknown backend, a plugin
        whose handler reports another backend name, or bad parameters.
        """
        name, factory = self._resolve(params.backend)
        handler = factory(params)
        reported = handler.get_backend()
        if reported not in (name, params.backend):
            raise RendezvousConfigError(
                f"rendezvous backend {name!r} built a handler that reports backend "
                f"{reported!r}; the plugin's get_backend() must return {name!r}"
            )
        return handler


def _unknown_backend(backend: str, names: list[str]) -> str:
    """The error text for ``--rdzv-backend backend`` when no backend of that name is known:
    the registered names, or that none is registered (and how to register one)."""
    install = (
        f"install a plugin that registers it under the entry-point group {ENTRY_POINT_GROUP!r}"
    )
    if not names:
        return (
            f"unknown rendezvous backend {backend!r}: no rendezvous backend is registered in "
            f"this registry; register one with registry.register({backend!r}, factory) "
            f"(aelastic.rendezvous.register for the default registry) or {install}"
        )
    return (
        f"unknown rendezvous backend {backend!r}; choose one of {', '.join(names)} "
        f"(--rdzv-backend), or {install}"
    )


def _default_registry() -> RendezvousHandlerRegistry:
    registry = RendezvousHandlerRegistry()
    registry.register("c10d", _c10d)
    registry.alias("tcp", "c10d")
    registry.register("static", _static)
    registry.register("etcd", _etcd)
    registry.register("etcd-v2", _etcd)
    return registry


#: The process-wide registry used by :func:`register` and :func:`get_rendezvous_handler`.
rendezvous_handler_registry = _default_registry()


def register(name: str, factory: HandlerFactory) -> None:
    """Register a backend in the default registry."""
    rendezvous_handler_registry.register(name, factory)


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Build a handler from the default registry."""
    return rendezvous_handler_registry.create_handler(params)


def get_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's name for :func:`create_handler`."""
    return rendezvous_handler_registry.create_handler(params)
