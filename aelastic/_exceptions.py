"""The root of aelastic's exception tree, and the rule for the errors outside it.

Every error aelastic raises on purpose derives from :class:`AelasticError`, so an embedding
service can catch the whole family with one ``except`` clause. Each package defines its
errors in its own ``_exceptions.py`` and exports those a caller catches by name;
:func:`show_public_module` makes tracebacks print the public name
(``aelastic.store.StoreTimeoutError``). One marked private is caught through its public
base (a setting that cannot work: :class:`ConfigError`). The tree (a second base in
brackets: ``except`` that builtin keeps working; ``tests/test_exceptions.py`` checks
this drawing against the classes)::

    AelasticError                               aelastic
        ConfigError [ValueError]                aelastic
            UsageError                          private
            LaunchConfigError                   private
            ProgressTimeoutError                private
            StoreConfigError [StoreError]       private
            RendezvousConfigError [RendezvousError]  private
            AgentConfigError [AgentError]       private
            NodeHealthConfigError [AgentError]  private
            StragglerConfigError                private
            ReplicaGroupConfigError [ReplicaGroupError]  private
        StoreError                              aelastic.store
            StoreTimeoutError [TimeoutError]
            StoreConnectionError [ConnectionError]
                NotAStoreError                  private
            StoreClosedError
            QueueEmptyError                     private
            ProtocolError                       private
            StoreLimitError [ValueError]        private
            StoreUnsupportedError               private
            EtcdCompactedError                  private
            EtcdRequestError                    private
        RendezvousError                         aelastic.rendezvous
            RendezvousClosedError
            RendezvousTimeoutError [TimeoutError]
            RendezvousConnectionError [ConnectionError]
                RendezvousEndpointError         private
            RendezvousStateError
            RendezvousGracefulExitError
            RendezvousNonRetryableError
            RendezvousUnsupportedLoopError      private
        ChildFailedError                        aelastic.errors
            NoProgressError                     aelastic.agent
        WorkerProcessError                      aelastic.workers
            WorkerStartError
            NoMoreExitsError                    private
            CallableResultError                 private
        AgentError                              aelastic.agent
            SignalException
            NodeUnhealthyError                  aelastic.nodes
                NodeExcludedError
        EventsError                             aelastic.events
            EventFormatError [ValueError]       private
            EventHandlerError                   private
            UnknownDestinationError [KeyError]  private
        MetricsError                            aelastic.metrics
        CheckpointError                         aelastic.checkpoint
        HealthPortError [OSError]               private
        JobViewError                            aelastic.jobview
        ReplicaGroupError                       aelastic.replicas
            LighthouseError
        JobStoppedError                         aelastic.launcher
        JobSignalError [ValueError]             private

Store failures become rendezvous failures in one place,
:func:`aelastic.rendezvous._exceptions.rendezvous_error`.

**When a builtin error is right.** Raise a builtin only for misuse that the caller's own
code must fix and that no ``except`` clause should handle: a :class:`TypeError` for an
argument of the wrong type, a :class:`ValueError` for a value outside a function's
documented domain given by a program (not a setting a user typed), a :class:`RuntimeError`
for a call in the wrong state (``start()`` twice, a method outside its ``async with``), and
:class:`AttributeError`/:class:`KeyError`/:class:`StopAsyncIteration` where a protocol
demands them. Anything a user of the library may want to catch and act on (a setting that
cannot work, a peer or store that failed, a worker that died) is one of ours, with a
message that names the value and the fix; a setting that cannot work is a :class:`ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ("AelasticError", "ConfigError")


class AelasticError(Exception):
    """Base class of every error raised by aelastic itself.

    Messages name the object involved (a key, an endpoint, a rank) and, where
    there is one, the fix.
    """


class ConfigError(AelasticError, ValueError):
    """A setting cannot work (a flag, a config field, a parameter); the message names it and
    the fix. Also a :class:`ValueError`, so callers that catch that keep working."""


def show_public_module(module: str, namespace: Mapping[str, object]) -> None:
    """Give the public errors defined in ``module`` (a package's ``_exceptions``: those its
    ``__all__`` names) the package's name as ``__module__``, so tracebacks and ``repr``
    print ``aelastic.store.StoreTimeoutError`` rather than a private path, as httpx and
    trio do. The package must export them (pickle finds a class through its
    ``__module__``); ``tests/test_exceptions.py`` checks that. An error left out of that
    ``__all__`` is private (callers catch its public base) and keeps its module's name.

    Called at the bottom of each ``_exceptions.py``, so lazily imported packages stay lazy.
    """
    public = module.rpartition(".")[0] if module.rpartition(".")[2] == "_exceptions" else module
    names = namespace.get("__all__")
    for value in namespace.values():
        if (
            isinstance(value, type)
            and issubclass(value, BaseException)
            and value.__module__ == module
            and (not isinstance(names, tuple) or value.__name__ in names)
        ):
            value.__module__ = public


show_public_module(__name__, globals())
