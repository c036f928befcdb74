"""Bad configurations are clear errors naming the key (raised before any model is loaded)."""

from __future__ import annotations

import subprocess
import sys

import jax
import pytest

from jaxppo.config import ConfigError, load_config
from jaxppo.trainer.ppo.build import build_run
from tests.trainer.conftest import REPO


@pytest.mark.parametrize("overrides, devices, match", [
    (["mesh.data=3"], 1, r"mesh: data=3 x fsdp=1 x tensor=1 = 3 devices, but 1 are available"),
    (["mesh.data=8", "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=4"], 8,
     r"actor.ppo_micro_batch_size .*=4 must be a multiple of the mesh batch shards"),
    (["pf_ppo.enabled=true"], 1, r"pf_ppo.enabled=true needs pf_ppo.filter"),
    (["importance.lower=0.5"], 1, r"importance.lower is only used with importance.mode=mask"),
    (["data.path=null"], 1, r"data.path is not set"),
])
def test_bad_config_is_a_clear_error(overrides, devices, match):
    if len(jax.devices()) < devices:
        pytest.skip(f"needs {devices} devices")
    cfg = load_config(None, ["trainer.output_dir=/nonexistent/never-written", *overrides])
    with pytest.raises(ConfigError, match=match):
        build_run(cfg, devices=jax.devices()[:devices])



@pytest.mark.parametrize("overrides, n_devices, match", [
    (["mesh.data=3"], 1, r"mesh: data=3 x fsdp=1 x tensor=1 = 3 devices, but 1 are available"),
    (["mesh.data=4", "mesh.fsdp=2", "dpo.batch_size=8", "dpo.micro_batch_size=4"], 8,
     r"dpo.micro_batch_size \(or dpo.batch_size\)=4 must be a multiple of the mesh batch shards mesh.data x "
     r"mesh.fsdp = 8"),
    (["mesh.data=4", "dpo.batch_size=6"], 4, r"dpo.micro_batch_size \(or dpo.batch_size\)=6 must be a multiple"),
    (["data.schema=scored"], 1, r"data.schema: DPO trains on preference pairs"),
])
def test_bad_dpo_config_is_a_clear_error(overrides, n_devices, match):
    """The DPO trainer's config check shares the mesh checks (``jaxppo.trainer.micro.check_mesh``) with the PPO trainer's."""
    from jaxppo.trainer.dpo.algorithm import check_dpo_config

    cfg = load_config(None, ["data.schema=preference", "data.path=/nonexistent/pairs.jsonl", *overrides])
    with pytest.raises(ConfigError, match=match):
        check_dpo_config(cfg, n_devices)
    ok = load_config(None, ["data.schema=preference", "data.path=/nonexistent/pairs.jsonl", "mesh.data=2",
                            "dpo.batch_size=4"])
    check_dpo_config(ok, 2)   # a good config passes

def test_missing_model_path_names_it(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "response": "b", "score": 1.0}\n')
    cfg = load_config(None, [f"model.path={tmp_path / 'no-model'}", f"data.path={data}"])
    with pytest.raises(FileNotFoundError, match="no-model"):
        build_run(cfg, devices=jax.devices()[:1])


def test_schema_errors_name_the_key():
    with pytest.raises(ConfigError, match="replay.capacity"):
        load_config(None, ["replay.capacity=8", "actor.ppo_mini_batch_size=64"])
    with pytest.raises(ConfigError, match="actor.ppo_micro_batch_size"):
        load_config(None, ["actor.ppo_mini_batch_size=64", "actor.ppo_micro_batch_size=5"])


def test_cli_unknown_key_exits_with_message():
    r = subprocess.run([sys.executable, "-m", "jaxppo.train", "trainer.totl_steps=3"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "trainer.totl_steps" in r.stderr and "config error" in r.stderr
