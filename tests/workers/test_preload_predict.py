"""The preload's prediction of the workers' world (aelastic.workers._preload), no process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.workers._preload import PreloadPlan, script_imports
from aelastic.workers._warm import open_warm_pool


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
    """With a predicted world the idle interpreters preload before any hand-off, in a
    thread: the first worker's at the agent's priority, the first restart's at nice 19.
    hurry() (a worker failed) gives the latter the agent's priority when the agent may
    (CAP_SYS_NICE), and changes nothing otherwise."""
    (tmp_path / "job.py").write_text("import colorsys\n")
    argv = [sys.executable, "-u", str(tmp_path / "job.py")]
    prefix = (sys.executable, "-u")
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    async with open_warm_pool(
        prefix, 1, preload=("auto",), predicted_worker=(argv, dict(os.environ), str(tmp_path))
    ) as pool:
        first, spare = pool.idle_pids  # the first worker's and the first restart's

        def threads(pid: int) -> list[int]:
            return [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]

        with anyio.fail_after(30):
            # another process's threads: nothing to await; they appear once it started
            while not (  # noqa: ASYNC110
                threads(first)
                and threads(spare)
                and all(_nice(spare, t) == 19 for t in threads(spare))
            ):
                await anyio.sleep(0.05)
        assert [_nice(first, t) for t in threads(first)] == [mine] * len(threads(first))
        lowered = threads(spare)
        pool.hurry()
        after = [_nice(spare, t) for t in lowered]
        assert after == [mine if _may_lower_nice() else 19] * len(lowered)
        assert [_nice(first, t) for t in threads(first)] == [mine] * len(threads(first))
