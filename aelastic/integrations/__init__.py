"""Steps for the goodput ledger from training frameworks, without changing the loop.

``report_optimizer_steps(optimizer)`` counts each ``optimizer.step()`` as an
``aelastic.progress`` step (any loop, accelerate's prepared optimizers too:
``report_accelerate_steps(accelerator)``); ``LightningCallback()`` reports Lightning's
``global_step`` after each training batch. Each loads its framework only when used
(``import aelastic.integrations`` imports nothing heavy); outside an agent's worker
every report is a no-op.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._lightning import LightningCallback as LightningCallback
    from ._optimizer import report_accelerate_steps as report_accelerate_steps
    from ._optimizer import report_optimizer_steps as report_optimizer_steps

__all__ = ("LightningCallback", "report_accelerate_steps", "report_optimizer_steps")

__getattr__, __dir__ = lazy_exports(__name__, globals())
