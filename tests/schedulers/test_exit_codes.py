"""The exit-code contract: the table and manifests in docs/kubernetes.md are the code's,
the manifests parse and say what Kubernetes needs, and a real job interrupted by
SIGINT exits with the documented code (the other codes have their own job tests:
tests/launcher test_hang_nodes 1/2/93, test_node_health 94, test_node_exclusion 95,
test_single_node 143)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from aelastic.agent._policy import PREEMPTED_EXIT_CODE
from aelastic.launcher._args import parse_run_args
from aelastic.schedulers._exit_codes import (
    EXIT_CODES,
    codes_with_action,
    exit_code_table,
    pod_failure_rules,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def _doc() -> str:
    return DOC.read_text()


def _manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", _doc(), flags=re.S)
    return [d for block in blocks for d in yaml.safe_load_all(block) if d]


def _by_kind(kind: str) -> dict[str, Any]:
    (found,) = [m for m in _manifests() if m.get("kind") == kind]
    return found


def test_the_docs_table_is_the_codes_table() -> None:
    doc = _doc()
    begin = doc.index("<!-- exit-codes:begin")
    begin = doc.index("\n", begin) + 1
    end = doc.index("<!-- exit-codes:end -->")
    assert doc[begin:end] == exit_code_table()


def test_the_contract_is_complete_and_consistent() -> None:
    codes = [e.code for e in EXIT_CODES]
    assert len(codes) == len(set(codes))
    assert {0, 1, 2, 93, 94, 95, 96, 130, 143} <= set(codes)
    for e in EXIT_CODES:
        # "do not retry" is what FailJob does; a free retry is Ignore; a bounded one Count
        expected = {"no": "FailJob", "yes": "Ignore", "limited": "Count"}[e.retry]
        assert e.kubernetes == ("none" if e.code == 0 else expected), e
    assert PREEMPTED_EXIT_CODE == 96  # the documented value of the agent's constant


def test_the_manifests_carry_the_contracts_rules() -> None:
    rules = yaml.safe_load(pod_failure_rules())["podFailurePolicy"]
    for rule in rules["rules"]:
        values = rule.get("onExitCodes", {}).get("values")
        if values is not None:  # Kubernetes wants them sorted, unique, and no 0 with In
            assert values == sorted(set(values)) and 0 not in values
    assert rules["rules"][1]["onExitCodes"]["values"] == codes_with_action("Ignore")
    assert rules["rules"][2]["onExitCodes"]["values"] == codes_with_action("FailJob")

    job = _by_kind("Job")["spec"]
    jobset = _by_kind("JobSet")["spec"]
    (replicated,) = jobset["replicatedJobs"]
    inner = replicated["template"]["spec"]
    assert job["podFailurePolicy"] == rules == inner["podFailurePolicy"]
    assert yaml.safe_load(re.search(r"```yaml\n(podFailurePolicy:.*?)```", _doc(), re.S)[1]) == {
        "podFailurePolicy": rules
    }
    assert jobset["failurePolicy"]["rules"][0] == {
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
    }
    for spec in (job, inner):
        assert spec["completionMode"] == "Indexed"
        assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy's rule
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == rules["rules"][1]["onExitCodes"]["containerName"]


def _launch_args(container: dict[str, Any]) -> tuple[list[str], str]:
    assert container["command"] == ["python", "-m", "aelastic", "run"]
    env = {e["name"]: "uid-1" for e in container["env"]}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]
    endpoint = next(a.split("=", 1)[1] for a in args if a.startswith("--rdzv-endpoint="))
    return args, endpoint.rsplit(":", 1)[0]


def test_the_manifests_launch_as_written() -> None:
    """Each manifest's command parses as aelastic's own command line, and its endpoint
    is the DNS name Kubernetes gives the pod of index 0."""
    service = _by_kind("Service")
    job = _by_kind("Job")
    jobset = _by_kind("JobSet")
    pod = job["spec"]["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["subdomain"] == service["metadata"]["name"]
    (replicated,) = jobset["spec"]["replicatedJobs"]
    set_pod = replicated["template"]["spec"]["template"]["spec"]
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    expected = {
        # an Indexed Job's pod: <job>-<index>.<subdomain>
        id(pod): f"{job['metadata']['name']}-0.{pod['subdomain']}",
        # a JobSet's: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<jobset>
        id(set_pod): (
            f"{jobset['metadata']['name']}-{replicated['name']}-0-0.{jobset['metadata']['name']}"
        ),
    }
    for spec in (pod, set_pod):
        (container,) = spec["containers"]
        args, host = _launch_args(container)
        assert host == expected[id(spec)]
        parsed = parse_run_args(args, environ={})
        assert parsed.config.rdzv_backend == "c10d"
        assert parsed.config.nproc_per_node == 8
        assert (parsed.config.min_nodes, parsed.config.max_nodes) == (4, 4)
        assert parsed.config.run_id == "uid-1"


SLEEPER = """\
import sys, time
open(sys.argv[1], "w").close()
time.sleep(120)
"""


def test_an_interrupted_job_exits_130(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    ready = tmp_path / "ready"
    argv = [sys.executable, "-m", "aelastic", "run", "--standalone", str(script), str(ready)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        _wait_for(ready, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    (interrupted,) = [e for e in EXIT_CODES if e.name == "interrupted"]
    assert proc.returncode == interrupted.code == 130, err
    assert interrupted.retry == "no"


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` exists (the worker runs), bounded; polls the file system only."""
    import time

    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
