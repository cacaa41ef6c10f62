"""Count optimizer steps as ``aelastic.progress`` steps (plain torch, accelerate)."""

from __future__ import annotations

from typing import Any

from .. import progress

__all__ = ("report_optimizer_steps", "report_accelerate_steps")


def report_optimizer_steps(optimizer: Any, start: int = 0) -> Any:
    """After each ``optimizer.step()``, report the next step (``start``, ``start + 1``...;
    pass the step a run resumed from so rollbacks are counted). Returns the hook's
    handle (``.remove()`` stops it). Raises ``TypeError`` for an object without torch's
    ``register_step_post_hook``."""
    register = getattr(optimizer, "register_step_post_hook", None)
    if register is None:
        inner = getattr(optimizer, "optimizer", None)  # accelerate's AcceleratedOptimizer
        register = getattr(inner, "register_step_post_hook", None)
    if register is None:
        raise TypeError(
            f"report_optimizer_steps: {type(optimizer).__name__} has no register_step_post_hook;"
            " pass a torch.optim.Optimizer (or accelerate's prepared one)"
        )
    count = [start]

    def hook(*_: Any) -> None:
        progress.step(count[0])
        count[0] += 1

    return register(hook)


def report_accelerate_steps(accelerator: Any, start: int = 0) -> list[Any]:
    """:func:`report_optimizer_steps` for every optimizer an ``accelerate.Accelerator``
    prepared (call after ``accelerator.prepare``). With several optimizers each reports
    the same step count; the ledger reads the latest."""
    optimizers = getattr(accelerator, "_optimizers", None)
    if not optimizers:
        raise TypeError(
            "report_accelerate_steps: the accelerator has prepared no optimizer yet;"
            " call it after accelerator.prepare(model, optimizer, ...)"
        )
    return [report_optimizer_steps(o, start) for o in optimizers]
