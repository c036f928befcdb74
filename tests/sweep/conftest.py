"""Fixtures of the sweep tests: the trainer tests' small collected dataset and tiny shapes."""

from tests.trainer.conftest import TINY, scored_data  # noqa: F401  (scored_data is a fixture)

__all__ = ["TINY", "scored_data"]


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def sweep_cache(tmp_path_factory):
    """An XLA compilation cache folder shared by the sweeps' runs of one test session."""
    return tmp_path_factory.mktemp("sweep_xla_cache")
