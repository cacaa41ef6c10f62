"""The elastic agent: one node's worker group, driven by an async state machine.

``LocalElasticAgent(spec)`` runs ``spec.local_world_size`` worker subprocesses;
``await agent.run()`` returns a :class:`RunResult`. Importing this package never
imports torch.
"""

from ._agent import ElasticAgent as ElasticAgent
from ._agent import SimpleElasticAgent as SimpleElasticAgent
from ._env import worker_env as worker_env
from ._exceptions import AgentConfigError as AgentConfigError
from ._exceptions import AgentError as AgentError
from ._exceptions import NoProgressError as NoProgressError
from ._exceptions import SignalException as SignalException
from ._local import LocalElasticAgent as LocalElasticAgent
from ._policy import NO_PROGRESS_EXIT_CODE as NO_PROGRESS_EXIT_CODE
from ._policy import PREEMPTED_EXIT_CODE as PREEMPTED_EXIT_CODE
from ._policy import Action as Action
from ._policy import Decision as Decision
from ._policy import decide_after_exit as decide_after_exit
from ._policy import decide_after_membership_change as decide_after_membership_change
from ._policy import restart_count as restart_count
from ._round_gate import RoundGate as RoundGate
from ._types import DEFAULT_ROLE as DEFAULT_ROLE
from ._types import RunResult as RunResult
from ._types import Worker as Worker
from ._types import WorkerGroup as WorkerGroup
from ._types import WorkerSpec as WorkerSpec
from ._types import WorkerState as WorkerState

__all__ = (
    "DEFAULT_ROLE",
    "NO_PROGRESS_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "Action",
    "AgentConfigError",
    "AgentError",
    "Decision",
    "ElasticAgent",
    "LocalElasticAgent",
    "NoProgressError",
    "RoundGate",
    "RunResult",
    "SignalException",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
    "decide_after_exit",
    "decide_after_membership_change",
    "restart_count",
    "worker_env",
)
