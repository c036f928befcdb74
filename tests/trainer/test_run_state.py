"""Every trainer's state declares the fields the run harness reads (``trainer.run_state.RunState``)."""

from __future__ import annotations

import dataclasses

import pytest

from jaxppo.trainer.dpo.steps import DPOState
from jaxppo.trainer.ppo.state import TrainState
from jaxppo.trainer.run_state import RUN_STATE_FIELDS, RunState


def test_protocol_fields_are_the_declared_ones():
    assert set(RUN_STATE_FIELDS) == set(RunState.__annotations__)


@pytest.mark.parametrize("state_cls", [TrainState, DPOState])
def test_states_have_the_harness_fields(state_cls):
    names = {f.name for f in dataclasses.fields(state_cls)}
    assert set(RUN_STATE_FIELDS) <= names
    assert callable(state_cls.replace)
