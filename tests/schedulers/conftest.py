"""The real Slurm cluster shared by this package's tests (see ``_slurm_cluster``).

Not skipped when Slurm is missing: CI installs ``slurm-wlm`` and ``munge`` (``.ci/run``),
so a missing binary is a failure to see, not a test to hide.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._slurm_cluster import SlurmCluster, slurm_cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd n1..n3 for the whole session; about a second to start."""
    with slurm_cluster() as cluster:
        yield cluster
