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
    from ._exceptions import ReplicaGroupConfigError as ReplicaGroupConfigError
    from ._exceptions import ReplicaGroupError as ReplicaGroupError
    from ._lighthouse import Lighthouse as Lighthouse
    from ._lighthouse import check_lighthouse as check_lighthouse
    from ._lighthouse import open_lighthouse as open_lighthouse
    from ._quorum import QuorumHistory as QuorumHistory
    from ._quorum import member_group as member_group
    from ._quorum import parse_status_page as parse_status_page
    from ._quorum import read_quorum as read_quorum
    from ._settings import LighthouseSettings as LighthouseSettings
    from ._settings import ReplicaGroups as ReplicaGroups
    from ._settings import after_group_failure as after_group_failure
    from ._settings import group_env as group_env
    from ._settings import group_run_id as group_run_id

__all__ = (
    "Lighthouse",
    "LighthouseError",
    "LighthouseSettings",
    "QuorumHistory",
    "ReplicaGroupConfigError",
    "ReplicaGroupError",
    "ReplicaGroups",
    "after_group_failure",
    "check_lighthouse",
    "group_env",
    "group_run_id",
    "member_group",
    "open_lighthouse",
    "parse_status_page",
    "read_quorum",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
