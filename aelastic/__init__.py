"""aelastic: an asyncio-native elastic launcher for PyTorch distributed jobs.

Importing aelastic never imports torch. Subpackages: ``aelastic.store``,
``aelastic.rendezvous``, ``aelastic.agent``, ``aelastic.workers``,
``aelastic.errors``, ``aelastic.events``, ``aelastic.metrics``, ``aelastic.progress``
(the workers' progress reporting: steps, hang detection), ``aelastic.goodput`` (where
the run's time went), ``aelastic.checkpoint`` (checkpoints in memory the agent owns),
``aelastic.health``, ``aelastic.replicas`` (torchft replica groups and their
Lighthouse), ``aelastic.stragglers`` (slow nodes found while the job runs),
``aelastic.jobview`` (the whole job's status, table and live page),
``aelastic.schedulers`` (Slurm and Kubernetes: their environment, progress and exit
codes); the launch API (``LaunchConfig``, ``launch``, ``open_job``, ``elastic_launch``) is
exported here, its code is in ``aelastic.launcher``. ``docs/api.md`` lists every public name.

Layers, lowest first. A module imports from its own package and from a lower layer (any
of its modules, private ones included: a subpackage's ``__init__`` is the door for users,
not for aelastic's own modules); the base helpers are shared by all
(``tests/test_layers.py`` enforces this, and that no two modules import each other)::

    0. base: _dataclass _entry_points _exceptions _features _ids _lazy _net _owned_dirs
    0. base too: _numbers _option_table _stacks_dump _tasks
    1. store errors metrics progress goodput
    2. events integrations
    3. workers rendezvous checkpoint
    4. agent
    5. health nodes replicas stragglers
    6. jobview schedulers
    7. launcher
    8. command line: cli
    9. python -m aelastic: __main__
"""

from typing import TYPE_CHECKING

from ._exceptions import AelasticError as AelasticError
from ._exceptions import ConfigError as ConfigError
from ._lazy import lazy_exports

if TYPE_CHECKING:  # the launch API loads on first use, so ``import aelastic`` stays light
    from .checkpoint._settings import CheckpointSettings as CheckpointSettings
    from .health._settings import HealthSettings as HealthSettings
    from .launcher._config import LaunchConfig as LaunchConfig
    from .launcher._job import Job as Job
    from .launcher._job import open_job as open_job
    from .launcher._job import run_job as run_job
    from .launcher._launch import elastic_launch as elastic_launch
    from .launcher._launch import launch as launch
    from .launcher._restart_settings import RestartSettings as RestartSettings
    from .nodes._settings import BadNodeSettings as BadNodeSettings
    from .progress._settings import HangSettings as HangSettings
    from .stragglers._settings import StragglerSettings as StragglerSettings
    from .workers._settings import PreloadSettings as PreloadSettings

__version__ = "0.1.0"

__all__ = (
    "AelasticError",
    "BadNodeSettings",
    "CheckpointSettings",
    "ConfigError",
    "HangSettings",
    "HealthSettings",
    "Job",
    "LaunchConfig",
    "PreloadSettings",
    "RestartSettings",
    "StragglerSettings",
    "__version__",
    "elastic_launch",
    "launch",
    "open_job",
    "run_job",
)

__getattr__, __dir__ = lazy_exports(__name__, globals())
