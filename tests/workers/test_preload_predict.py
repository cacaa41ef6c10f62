"""The preload's prediction of the workers' world (aelastic.workers._preload), no process."""

from __future__ import annotations

from pathlib import Path

from aelastic.workers._preload import PreloadPlan, script_imports


def test_script_imports_are_the_unconditional_top_level_ones(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch.distributed as dist\n"
        "from torch import nn\n"
        "from . import sibling\n"
        "import os\n"
        "try:\n    import apex\nexcept ImportError:\n    pass\n"
        "if True:\n    import numpy\n"
        "def main():\n    import pandas\n"
    )
    assert script_imports(str(script)) == ["os", "torch.distributed", "torch"]
    (tmp_path / "bad.py").write_text("def (:\n")
    assert script_imports(str(tmp_path / "bad.py")) == []
    assert script_imports(str(tmp_path / "missing.py")) == []


def test_a_prediction_fits_only_the_same_environment_but_per_worker_and_ours() -> None:
    predicted = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "AELASTIC_X": "a"}
    worker = {**predicted, "RANK": "3", "MASTER_PORT": "29500", "AELASTIC_X": "b"}
    assert PreloadPlan.fits_prediction(predicted, worker)
    assert not PreloadPlan.fits_prediction(predicted, {**worker, "OMP_NUM_THREADS": "4"})
    assert not PreloadPlan.fits_prediction(predicted, {**worker, "TORCH_NEW": "1"})
    assert PreloadPlan.fits_prediction(None, worker)


def test_auto_queues_the_scripts_imports_and_a_hand_off_ends_the_prediction(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.py").write_text("import torch\nimport json\n")
    plan = PreloadPlan(["auto"])
    try:
        env = {"PATH": "/bin"}
        plan.predict("script", "job.py", ["job.py"], env, str(tmp_path))
        assert plan.predicted and plan.message() is not None
        learned = Path(plan.dir, "learned", "learned-script").read_text()
        assert learned == "torch\njson\n"
        plan.observe("script", "job.py", ["job.py"], {**env, "RANK": "0"}, str(tmp_path))
        assert not plan.predicted
        plan.predict("script", "job.py", ["job.py"], {"PATH": "/x"}, str(tmp_path))
        assert not plan.predicted  # a real world is never replaced by a prediction
    finally:
        plan.close()
