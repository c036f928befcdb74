"""The typed YAML config system: loading, overrides, strict errors, inheritance, round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config import Config, ConfigError, dump, load_config, parse_override, to_dict

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_defaults_follow_the_source_article():
    cfg = load_config()
    assert cfg.actor.clip_ratio == 0.2
    assert cfg.algorithm.gamma == 0.99 and cfg.algorithm.lam == 0.95
    assert cfg.actor.ppo_mini_batch_size == 64
    assert cfg.critic.ppo_epochs == 4
    assert cfg.actor.kl_loss_coef == 0.001 and cfg.actor.kl_loss_type == "k1+"
    assert cfg.replay.alpha == 0.6 and cfg.replay.beta0 == 0.4 and cfg.replay.refresh_every == 100
    assert cfg.guards.kl_threshold == 0.05
    # the KL guard cuts the LR relative to the current one (an absolute kl_lr only when set)
    assert cfg.guards.kl_lr is None and cfg.guards.kl_lr_factor == 0.1


def test_yaml_then_dotted_overrides(tmp_path):
    p = write(tmp_path, "a.yaml", "actor:\n  clip_ratio: 0.25\ntrainer:\n  total_steps: 7\n")
    cfg = load_config(p, ["actor.clip_ratio=0.3", "trainer.output_dir=runs/x", "algorithm.kl_ctrl.type=adaptive"])
    assert cfg.actor.clip_ratio == 0.3
    assert cfg.trainer.total_steps == 7
    assert cfg.trainer.output_dir == "runs/x"
    assert cfg.algorithm.kl_ctrl.type == "adaptive"


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.actor.clip_ratio = 0.5  # type: ignore[misc]


def test_asymmetric_clip_defaults_to_clip_ratio():
    cfg = load_config(overrides=["actor.clip_ratio=0.1", "actor.clip_ratio_high=0.28"])
    assert cfg.actor.clip_low == 0.1 and cfg.actor.clip_high == 0.28


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"actor\.clip_ration.*clip_ratio"):
        load_config(overrides=["actor.clip_ration=0.3"])


def test_unknown_section_is_named(tmp_path):
    p = write(tmp_path, "a.yaml", "actr:\n  clip_ratio: 0.3\n")
    with pytest.raises(ConfigError, match=r"'actr'.*actor"):
        load_config(p)


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"trainer\.total_steps.*integer"):
        load_config(overrides=["trainer.total_steps=lots"])
    with pytest.raises(ConfigError, match=r"trainer\.progress.*true or false"):
        load_config(overrides=["trainer.progress=maybe"])


def test_out_of_range_names_key_and_bound():
    with pytest.raises(ConfigError, match=r"actor\.clip_ratio.*out of range"):
        load_config(overrides=["actor.clip_ratio=1.5"])
    with pytest.raises(ConfigError, match=r"algorithm\.gamma.*out of range"):
        load_config(overrides=["algorithm.gamma=-0.1"])


def test_literal_lists_allowed_values():
    with pytest.raises(ConfigError, match=r"actor\.loss_agg_mode.*token-mean"):
        load_config(overrides=["actor.loss_agg_mode=average"])


def test_cross_field_rules():
    with pytest.raises(ConfigError, match=r"ppo_micro_batch_size.*divide"):
        load_config(overrides=["actor.ppo_mini_batch_size=64", "actor.ppo_micro_batch_size=10"])
    with pytest.raises(ConfigError, match=r"importance\.lower"):
        load_config(overrides=["importance.lower=3.0", "importance.threshold=2.0"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(overrides=["actor.clip_ratio"])
    with pytest.raises(ConfigError, match="empty key segment"):
        load_config(overrides=["actor..clip_ratio=0.1"])
    with pytest.raises(ConfigError, match=r"actor\.clip_ratio.*expected a number"):
        load_config(overrides=["actor.clip_ratio.x=1"])


def test_override_into_a_scalar_from_a_file_is_not_a_section(tmp_path):
    p = write(tmp_path, "a.yaml", "actor:\n  clip_ratio: 0.2\n")
    with pytest.raises(ConfigError, match="not a section"):
        load_config(p, ["actor.clip_ratio.x=1"])


def test_extends_merges_child_over_parent(tmp_path):
    write(tmp_path, "base.yaml", "actor:\n  clip_ratio: 0.1\n  entropy_coeff: 0.01\ntrainer:\n  total_steps: 3\n")
    child = write(tmp_path, "child.yaml", "extends: base.yaml\nactor:\n  clip_ratio: 0.3\n")
    cfg = load_config(child)
    assert cfg.actor.clip_ratio == 0.3 and cfg.actor.entropy_coeff == 0.01 and cfg.trainer.total_steps == 3


def test_extends_cycle_and_missing_file(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_is_safe_loaded(tmp_path):
    p = write(tmp_path, "evil.yaml", "trainer: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "l.yaml", "- 1\n- 2\n"))


def test_dump_round_trips(tmp_path):
    cfg = load_config(overrides=["actor.clip_ratio_high=0.28", "mesh.data=2", "data.columns={prompt: q}"])
    dump(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == cfg
    assert to_dict(cfg)["data"]["columns"] == {"prompt": "q"}


@given(st.floats(min_value=0.01, max_value=0.99, allow_nan=False), st.integers(min_value=1, max_value=10**6))
def test_numeric_overrides_round_trip(clip, steps):
    cfg = load_config(overrides=[f"actor.clip_ratio={clip!r}", f"trainer.total_steps={steps}"])
    assert cfg.actor.clip_ratio == clip and cfg.trainer.total_steps == steps


def test_parse_override_uses_yaml_scalars():
    assert parse_override("a.b=0.3") == (["a", "b"], 0.3)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=runs/x") == (["a"], "runs/x")


# sweep files (configs/sweeps/) have their own schema and are checked by tests/sweep/test_spec.py
SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.yaml") if "prompts" not in p.parts and "sweeps" not in p.parts)


def test_configs_are_shipped():
    assert SHIPPED, "configs/ holds no YAML config"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_shipped_config_loads(path):
    assert isinstance(load_config(path), Config)


def test_removed_keys_are_named_as_removed():
    for key in ("data.buckets=2", "data.bucket_multiple=16"):
        with pytest.raises(ConfigError, match=rf"unknown key '{key.split('=')[0]}': it was removed"):
            load_config(None, [key])
    with pytest.raises(ConfigError, match="did you mean 'data.max_rows'"):   # other unknown keys: as before
        load_config(None, ["data.max_row=2"])


def test_data_packing_is_a_checked_bool_off_by_default():
    assert load_config().data.packing is False
    assert load_config(overrides=["data.packing=true"]).data.packing is True
    with pytest.raises(ConfigError, match=r"data\.packing"):
        load_config(overrides=["data.packing=sometimes"])
