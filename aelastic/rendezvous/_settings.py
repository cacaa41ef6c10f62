"""The dynamic rendezvous's settings: its timeouts, read from torch's ``--rdzv-conf`` keys."""

from __future__ import annotations

from .._dataclass import dataclass
from ._exceptions import RendezvousConfigError
from ._params import RendezvousParameters
from ._waiting import WAIT_REPORT_INTERVAL

__all__ = ("DynamicSettings",)


@dataclass(frozen=True)
class DynamicSettings:
    """Timeouts of the dynamic rendezvous, in seconds (floats allowed).

    ``heartbeat_timeout`` defaults to ``keep_alive_interval * keep_alive_max_attempt``:
    a node that acknowledged no tick for that long is removed, and a coordinator that
    published none for that long is considered gone.
    """

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    heartbeat_timeout: float = 15.0
    read_timeout: float = 60.0
    #: Seconds between two "still waiting for peers" lines while joining.
    wait_report_interval: float = WAIT_REPORT_INTERVAL

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> DynamicSettings:
        """Read torch's ``--rdzv-conf`` keys; raise RendezvousConfigError naming a bad one."""
        interval = params.get_positive_float("keep_alive_interval", 5.0)
        attempts = params.get_as_int("keep_alive_max_attempt", 3)
        assert attempts is not None
        if attempts < 1:
            raise RendezvousConfigError(
                f"rendezvous config keep_alive_max_attempt={attempts} must be >= 1"
            )
        return cls(
            join_timeout=params.get_positive_float("join_timeout", 600.0),
            last_call_timeout=params.get_positive_float("last_call_timeout", 30.0),
            close_timeout=params.get_positive_float("close_timeout", 30.0),
            keep_alive_interval=interval,
            keep_alive_max_attempt=attempts,
            heartbeat_timeout=params.get_positive_float("heartbeat_timeout", interval * attempts),
            read_timeout=params.get_positive_float("read_timeout", 60.0),
            wait_report_interval=params.get_positive_float(
                "wait_report_interval", WAIT_REPORT_INTERVAL
            ),
        )
