"""Fixtures of the sweep tests: the trainer tests' small collected dataset and tiny shapes."""

from tests.trainer.conftest import TINY, scored_data  # noqa: F401  (scored_data is a fixture)

__all__ = ["TINY", "scored_data"]

