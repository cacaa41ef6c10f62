"""``aelastic.integrations``: steps from an unchanged training loop (a real torch worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio

from aelastic import LaunchConfig, open_job
from aelastic.progress._reader import ProgressFile

LOOP = """
import torch
from aelastic.integrations import report_accelerate_steps, report_optimizer_steps
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
report_optimizer_steps(optimizer, start=5)  # resumed after step 4
for _ in range(3):
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
for report in (report_optimizer_steps, report_accelerate_steps):
    try:
        report(object())
    except TypeError as exc:
        print(exc)
"""


def test_optimizer_steps_are_reported_as_steps(tmp_path: Path) -> None:
    progress = ProgressFile(str(tmp_path / "w.progress"))
    env = {**os.environ, "AELASTIC_PROGRESS_FILE": progress.path}
    done = subprocess.run(
        [sys.executable, "-c", LOOP], env=env, check=True, capture_output=True, text=True
    )
    snap = progress.snapshot()
    assert (snap.first_step, snap.step) == (5, 7)
    # the wrong object: one error naming the fix, not a deep traceback
    assert "object has no register_step_post_hook" in done.stdout
    assert "call it after accelerator.prepare(model, optimizer, ...)" in done.stdout


def test_importing_the_integrations_loads_no_framework() -> None:
    code = (
        "import sys, aelastic.integrations as i; i.__all__;"
        "print(sorted(m for m in ('torch', 'lightning', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


TRAINER = """
import torch
import pytorch_lightning as pl
from aelastic.integrations import LightningCallback

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
    def training_step(self, batch, _):
        return self.layer(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2)), batch_size=2)
trainer = pl.Trainer(
    max_steps=6, callbacks=[LightningCallback()], accelerator="cpu", logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Tiny(), data)
"""


async def test_a_lightning_trainer_job_has_a_ledger_of_steps(tmp_path: Path) -> None:
    """A real Trainer under the agent: the callback's steps reach the job's ledger."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
    )
    with anyio.fail_after(240):
        async with open_job(config, sys.executable, "-u", str(script)) as job:
            await job.wait()
            record = job.goodput()
    assert record is not None
    # global_step 1..6 after each training batch; the first step counts to the start-up
    assert (record["steps_kept"], record["steps_lost"]) == (6, 0)
    assert 0 < record["productive_s"] < record["wall_s"]
