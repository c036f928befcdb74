"""notebooks/importance_sampling.ipynb executes end to end with PROFILE="ci" (a file of its own: see tests/notebooks/ci_run.py)."""

import pytest

from tests.notebooks.ci_run import execute_ci_profile


@pytest.mark.slow
@pytest.mark.processes
def test_notebook_executes_ci_profile(tmp_path):
    verdicts = execute_ci_profile("importance_sampling", tmp_path)   # checks the conclusion's numbers and outputs
    assert len(verdicts) >= 2 and all(m.group(0) for m in verdicts)
