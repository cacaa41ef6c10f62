"""torchft replica groups: one fault stops one group, not the job.

``aelastic run --replica-groups N`` runs a torchft job as N independent elastic
groups: each its own rendezvous and worker store, its own restart budget, its
workers told torchft's ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` and
``TORCHFT_LIGHTHOUSE``. The groups meet only in torchft's quorum, through the
Lighthouse, which aelastic starts and keeps running (:func:`open_lighthouse`) unless
``--lighthouse URL`` names one (:func:`check_lighthouse`). The runner publishes
each group's state and the quorum's membership over time (:func:`read_quorum`,
:class:`QuorumHistory`) for ``aelastic status``. A group that spends its
restart budget is excluded (or replaced by a spare) and the job goes on with the
others. Settings and decisions are plain (:mod:`._settings`); the launcher runs the
groups (``aelastic.launcher``). See ``docs/replica-groups.md``.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._exceptions import LighthouseError as LighthouseError
    from ._exceptions import ReplicaGroupError as ReplicaGroupError

__all__ = (
    "LighthouseError",
    "ReplicaGroupError",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
