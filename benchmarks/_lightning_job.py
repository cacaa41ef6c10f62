"""A Lightning Trainer job for ``restart_to_step.py --lightning`` (needs ``pip install lightning``).

Same shape as ``tests/agent/scripts/preload_job.py``: an MLP with AdamW, 2 CPU
processes (gloo DDP; Lightning takes ranks from the launcher's torchelastic
environment), a checkpoint every 10 steps, rank 1 leaves by ``os._exit(1)`` just
before step 25 on the first attempt, the restart resumes from the last checkpoint.
Records the same ``top``/``crash``/``step``/``final`` JSON lines to ``--out``, with
the options and helpers of ``preload_job.py`` (``--import``/``--set-env`` unused).
"""

import sys

PRELOADED = sorted(m for m in ("colorsys", "torch", "wave") if m in sys.modules)

import os  # noqa: E402
import time  # noqa: E402

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "agent", "scripts")
)
from preload_job import begin, record, simulate_compute  # noqa: E402


def main() -> int:
    opts, attempt, rank = begin(PRELOADED)
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
            )
            self.first = True

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            step = self.global_step
            if attempt == 0 and rank == opts.crash_rank and step == opts.crash_at:
                record(opts.out, event="crash", rank=rank, t=time.time())
                os._exit(1)
            (x,) = batch
            return torch.nn.functional.mse_loss(self.net(x), x.sum(dim=1, keepdim=True).sin())

        def on_train_batch_end(self, *args: object) -> None:
            if self.first:
                self.first = False
                record(opts.out, event="step", attempt=attempt, rank=rank, t=time.time())
            simulate_compute(opts)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(1234)
    data = DataLoader(TensorDataset(torch.randn(32 * opts.steps, 16)), batch_size=16)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=opts.checkpoint, every_n_train_steps=opts.checkpoint_every, save_last=True
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=opts.steps,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = os.path.join(opts.checkpoint, "last.ckpt")
    trainer.fit(Net(), data, ckpt_path=last if os.path.exists(last) else None)
    if rank == 0:
        record(opts.out, event="final", attempt=attempt, t=time.time())
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
