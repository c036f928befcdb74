"""jaxppo.trainer.mesh: the run's mesh and sharding rules from the config."""

from __future__ import annotations

import jax
import pytest

from jaxppo.config import ConfigError, load_config
from jaxppo.parallel import DEFAULT_RULES
from jaxppo.trainer.mesh import mesh_from_config


def test_mesh_from_config_builds_the_mesh_and_a_bad_rule_is_a_config_error():
    mesh, rules = mesh_from_config(load_config(None, ["mesh.data=2", "mesh.fsdp=4"]).mesh, jax.devices()[:8])
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1} and rules == DEFAULT_RULES
    bad = load_config(None, ["mesh.data=1", "mesh.fsdp=1", "mesh.rules={embed: model}"]).mesh
    with pytest.raises(ConfigError, match=r"mesh\.rules\.embed.*unknown mesh axis 'model'"):
        mesh_from_config(bad, jax.devices()[:1])
