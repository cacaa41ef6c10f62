"""The preload's prediction of the workers' world (aelastic.workers._preload), no process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.workers import open_warm_pool
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


def _nice(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[16])  # field 19: nice


def _may_lower_nice() -> bool:
    """Whether this process may lower a nice value (CAP_SYS_NICE), probed on a thread."""
    import threading

    result: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, 0) + 1)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, 0))
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result[0]


@pytest.mark.anyio
async def test_predicted_preload_starts_at_once_and_hurry_raises_its_thread(
    tmp_path: Path,
) -> None:
    """With a predicted world the idle interpreters preload before any hand-off, at nice
    19 in a thread; hurry() (a worker failed) gives that thread the agent's priority when
    the agent may (CAP_SYS_NICE), and changes nothing otherwise."""
    (tmp_path / "job.py").write_text("import colorsys\n")
    argv = [sys.executable, "-u", str(tmp_path / "job.py")]
    prefix = (sys.executable, "-u")
    async with open_warm_pool(
        prefix, 1, preload=("auto",), predicted_worker=(argv, dict(os.environ), str(tmp_path))
    ) as pool:
        assert len(pool.idle_pids) == 2  # the first worker's and the first restart's
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        with anyio.fail_after(30):
            while True:  # the preload thread appears once the interpreter has started
                threads = {
                    pid: [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
                    for pid in pool.idle_pids
                }
                if all(threads.values()) and all(
                    _nice(p, t) == 19 for p, ts in threads.items() for t in ts
                ):
                    break
                await anyio.sleep(0.05)
        raised = pool.hurry()
        after = [_nice(p, t) for p, ts in threads.items() for t in ts]
        if _may_lower_nice():
            assert raised == len(after) and after == [mine] * len(after)
        else:
            assert raised == 0 and after == [19] * len(after)
