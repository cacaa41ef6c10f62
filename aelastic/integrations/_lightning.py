"""``LightningCallback``: Lightning's ``global_step`` as ``aelastic.progress`` steps.

Imports Lightning (``lightning`` or ``pytorch_lightning``) when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import progress

__all__ = ("LightningCallback",)


def _callback_base() -> Any:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name).Callback
        except ImportError:
            continue
    raise ImportError(
        "aelastic.integrations.LightningCallback needs Lightning: pip install lightning"
    )


class LightningCallback(_callback_base()):  # type: ignore[misc]
    """``Trainer(callbacks=[LightningCallback()])``: after each training batch the
    trainer's ``global_step`` (resumed from a checkpoint, so rollbacks are counted) is
    reported to the agent."""

    def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
        progress.step(int(trainer.global_step))
