"""The elastic agent: one node's worker group, driven by an async state machine.

``LocalElasticAgent(spec)`` runs ``spec.local_world_size`` worker subprocesses;
``await agent.run()`` returns a :class:`RunResult`. Importing this package never
imports torch.
"""

from ._agent import ElasticAgent as ElasticAgent
from ._agent import SimpleElasticAgent as SimpleElasticAgent
from ._exceptions import AgentError as AgentError
from ._exceptions import NoProgressError as NoProgressError
from ._exceptions import SignalException as SignalException
from ._local import LocalElasticAgent as LocalElasticAgent
from ._types import DEFAULT_ROLE as DEFAULT_ROLE
from ._types import RunResult as RunResult
from ._types import Worker as Worker
from ._types import WorkerGroup as WorkerGroup
from ._types import WorkerSpec as WorkerSpec
from ._types import WorkerState as WorkerState

__all__ = (
    "DEFAULT_ROLE",
    "AgentError",
    "ElasticAgent",
    "LocalElasticAgent",
    "NoProgressError",
    "RunResult",
    "SignalException",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
)
