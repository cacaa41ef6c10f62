"""Errors raised by rendezvous handlers (seed names kept as aliases), and the one place
where store errors become rendezvous errors (:func:`map_store_errors`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType

from .._exceptions import AelasticError, ConfigError, show_public_module
from ..store import StoreClosedError, StoreConnectionError, StoreError, StoreTimeoutError

__all__ = (
    "RendezvousError",
    "RendezvousClosedError",
    "RendezvousTimeoutError",
    "RendezvousConnectionError",
    "RendezvousStateError",
    "RendezvousGracefulExitError",
    "RendezvousNonRetryableError",
    "map_store_errors",
    "rendezvous_error",
)


class RendezvousError(AelasticError):
    """Base class of every rendezvous error."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous of this run was closed: the job is finishing, do not rejoin."""

    @classmethod
    def for_run(cls, run_id: str) -> RendezvousClosedError:
        """The error a node gets when it finds run ``run_id``'s rendezvous closed."""
        return cls(
            f"rendezvous {run_id!r} is closed: another node failed with no restarts left"
            " (its output has the cause) or the job is ending; not rejoining"
        )


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """The rendezvous did not complete in time (join, last call or close timeout)."""


class RendezvousConnectionError(RendezvousError, ConnectionError):
    """The rendezvous backend (store, etcd) could not be reached."""


class RendezvousEndpointError(RendezvousConnectionError):
    """Something answered at the rendezvous endpoint, but not the backend (another
    service holds the address); the message says what answered. Never retried."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state in the backend is malformed or inconsistent."""


class RendezvousGracefulExitError(RendezvousError):
    """The node should exit without error (for example it was not admitted and the run ended)."""


class RendezvousNonRetryableError(RendezvousError):
    """A failure that should not be retried by the same agent process (seed name)."""


class RendezvousConfigError(RendezvousError, ConfigError):
    """A rendezvous parameter or ``--rdzv-conf`` key is invalid; the message names it and
    the fix. Also a :class:`ValueError`, as torch raises for bad parameters."""


class RendezvousUnsupportedLoopError(RendezvousError):
    """The backend cannot run on the current async library (e.g. etcd on trio).

    Raised before any I/O; the message names the reason and the alternatives.
    """


#: Seed 003's name for :class:`RendezvousClosedError`.
RendezvousClosedException = RendezvousClosedError
#: Seed 003's name for :class:`RendezvousTimeoutError`.
RendezvousTimeoutException = RendezvousTimeoutError


def rendezvous_error(exc: StoreError | OSError, action: str) -> RendezvousError:
    """The rendezvous error for store failure ``exc`` met while trying to do ``action``.

    Every backend translates through here, so one failure means the same everywhere: a
    lost, closed or unanswering store (:class:`~aelastic.store.StoreConnectionError`,
    :class:`~aelastic.store.StoreClosedError`, :class:`~aelastic.store.StoreTimeoutError`,
    an :class:`OSError`) is a :class:`RendezvousConnectionError`; any other store error (a
    counter that is not a number, an oversized value, a refused request) means the stored
    state is wrong: :class:`RendezvousStateError`. ``action`` names what was tried and on
    which key or run (``"add to 'rdzv/round'"``).
    """
    if isinstance(exc, (StoreConnectionError, StoreClosedError, StoreTimeoutError, OSError)):
        return RendezvousConnectionError(
            f"rendezvous store unreachable while trying to {action}: {exc}"
        )
    return RendezvousStateError(f"rendezvous store refused to {action}: {exc}")


def map_store_errors(
    action: str, *, keep: tuple[type[StoreError], ...] = ()
) -> AbstractContextManager[None]:
    """Raise store errors met inside the block as :func:`rendezvous_error` ``from`` them.

    ``keep`` lists store errors that pass through untranslated (a blocking read whose
    caller handles its own :class:`~aelastic.store.StoreTimeoutError`). A plain class,
    not a generator: it wraps every store request of the rendezvous.
    """
    return _StoreErrorMap(action, keep)


class _StoreErrorMap:
    __slots__ = ("_action", "_keep")

    def __init__(self, action: str, keep: tuple[type[StoreError], ...]) -> None:
        self._action = action
        self._keep = keep

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None or isinstance(exc, self._keep):
            return
        if isinstance(exc, RendezvousError):
            return  # already ours (a watched request whose store host was found lost)
        if isinstance(exc, (StoreError, OSError)):
            raise rendezvous_error(exc, self._action) from exc


show_public_module(__name__, globals())
