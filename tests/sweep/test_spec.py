"""The sweep file: schema errors and bad overrides fail before any run starts; profiles; the run plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jaxppo.sweeps.spec import SweepError, load_sweep, parse_sweep, plan_runs

REPO = Path(__file__).resolve().parents[2]
BASE = str(REPO / "configs" / "smoke.yaml")  # actor.ppo_mini_batch_size: 32


def _raw(**kw) -> dict:
    raw = {"base": BASE, "seeds": [0, 1, 2, 3, 4], "variants": {"uniform": ["replay.sampling=uniform"],
                                                                "per": ["replay.alpha=0.6"]},
           "baseline": "uniform", "eval": {"every_samples": 64, "samples_per_prompt": 2, "prompts": 8},
           "budget": {"samples": 512}, "output_dir": "runs/sweeps/x"}
    raw.update(kw)
    return raw


def test_plan_translates_eval_and_budget_into_steps():
    spec = parse_sweep(_raw(overrides=["trainer.progress=false"]))
    runs = plan_runs(spec)
    assert [(r.variant, r.seed) for r in runs] == [(v, s) for v in ("uniform", "per") for s in range(5)]
    r = runs[6]  # per, seed 1
    assert (r.batch_size, r.total_steps, r.eval_every) == (32, 16, 2)  # 512 / 32, 64 / 32
    assert r.out_dir == Path("runs/sweeps/x/runs/per/seed1")
    assert r.argv("py")[:5] == ["py", "-m", "jaxppo.train", "--config", BASE]
    ov = r.overrides
    assert ov.index("trainer.progress=false") < ov.index("replay.alpha=0.6") < ov.index("trainer.seed=1")
    for o in ("trainer.total_steps=16", "trainer.eval_every=2", "trainer.eval_samples=2", "trainer.eval_prompts=8",
              "trainer.output_dir=runs/sweeps/x/runs/per/seed1", "trainer.resume=auto"):
        assert o in ov
    assert r.config["trainer"]["total_steps"] == 16 and r.config["replay"]["alpha"] == 0.6
    assert r.tokens_per_sample == 24 + 32


def test_a_variant_may_change_the_batch_size_and_the_x_axis_stays_samples():
    spec = parse_sweep(_raw(variants={"uniform": [], "big": ["actor.ppo_mini_batch_size=64"]}))
    runs = {r.variant: r for r in plan_runs(spec)}
    assert (runs["uniform"].total_steps, runs["uniform"].eval_every) == (16, 2)
    assert (runs["big"].total_steps, runs["big"].eval_every) == (8, 1)


@pytest.mark.parametrize("kw, match", [
    (dict(variants={"uniform": [], "per": ["replay.alpah=0.6"]}), r"variant 'per' seed 0: .*replay\.alpah"),
    (dict(variants={"uniform": [], "per": ["replay.alpha=-1"]}), r"variant 'per' seed 0: .*replay\.alpha"),
    (dict(variants={"uniform": [], "per": ["replay.sampling=sometimes"]}), r"replay\.sampling"),
    (dict(overrides=["actor.clip_ratio=lots"]), r"actor\.clip_ratio"),
    (dict(eval={"every_samples": 48}, budget={"samples": 384}), r"every_samples=48 is not a multiple of "
                                                               r"actor\.ppo_mini_batch_size=32"),
])
def test_bad_overrides_fail_in_the_plan(kw, match):
    spec = parse_sweep(_raw(**kw))
    with pytest.raises(SweepError, match=match):
        plan_runs(spec)


@pytest.mark.parametrize("kw, match", [
    (dict(varients={}), r"unknown key 'varients'; did you mean 'variants'\?"),
    (dict(bootstrap={"resamples": 10}), r"unknown key 'bootstrap': it was removed"),
    (dict(baseline="nope"), r"baseline: 'nope' is not a variant"),
    (dict(budget={"samples": 100}), r"budget\.samples=100 is not a multiple of eval\.every_samples=64"),
    (dict(eval={"every_sample": 64}), r"unknown key 'eval\.every_sample'; did you mean 'eval\.every_samples'"),
    (dict(seeds=[0, 0]), r"seeds: duplicates"),
    (dict(seeds=[]), r"seeds: expected a non-empty list"),
    (dict(command="ppo"), r"command: 'ppo' is not allowed; expected one of 'train', 'dpo'"),
    (dict(base="configs/nope.yaml"), r"base: config file configs/nope.yaml not found"),
    (dict(variants={"a b": []}, baseline="a b"), r"name 'a b' must be"),
    (dict(variants={"uniform": ["replay.sampling"]}), r"'replay.sampling' is not of the form dotted.key=value"),
    (dict(overrides=["trainer.total_steps=5"]), r"'trainer\.total_steps' is set by the sweep itself"),
    (dict(variants={"uniform": ["trainer.seed=3"]}), r"variants\.uniform: 'trainer\.seed' is set by the sweep"),
    (dict(eval={"every_samples": 0}), r"eval\.every_samples: 0 is out of range; must be >= 1"),
])
def test_bad_sweep_files_fail_on_load(kw, match):
    with pytest.raises(SweepError, match=match):
        parse_sweep(_raw(**kw))


def test_eval_prompts_may_come_from_the_overrides_when_eval_prompts_is_not_given():
    runs = plan_runs(parse_sweep(_raw(eval={"every_samples": 64}, overrides=["trainer.eval_prompts=5"])))
    assert runs[0].config["trainer"]["eval_prompts"] == 5 and runs[0].config["trainer"]["eval_samples"] == 1


def test_profile_merges_mappings_appends_overrides_and_replaces_the_rest():
    raw = _raw(overrides=["trainer.progress=false", "trainer.eval_prompts=4"],
               eval={"every_samples": 64},
               profiles={"ci": {"seeds": [0, 1], "budget": {"samples": 256}, "overrides": ["trainer.eval_prompts=2"],
                                "variants": {"per": ["replay.alpha=1.0"]}}})
    with pytest.warns(UserWarning, match="2 seeds"):
        spec = parse_sweep(raw, profile="ci")
    assert spec.seeds == (0, 1) and spec.budget_samples == 256
    assert spec.overrides == ("trainer.progress=false", "trainer.eval_prompts=4", "trainer.eval_prompts=2")
    assert spec.variants == {"uniform": ("replay.sampling=uniform",), "per": ("replay.alpha=1.0",)}
    runs = plan_runs(spec)
    assert runs[0].config["trainer"]["eval_prompts"] == 2 and runs[0].total_steps == 8
    full = parse_sweep(raw)  # without the profile
    assert full.seeds == (0, 1, 2, 3, 4) and full.budget_samples == 512
    with pytest.raises(SweepError, match=r"--profile 'gpu': not in this sweep file's profiles \(ci\)"):
        parse_sweep(raw, profile="gpu")
    with pytest.raises(SweepError, match=r"profiles\.ci: unknown key 'seed'"):
        parse_sweep(_raw(profiles={"ci": {"seed": [0]}}), profile="ci")


def test_a_profile_leaves_out_a_variant_set_to_null():
    three = {"uniform": ["replay.sampling=uniform"], "per": ["replay.alpha=0.6"], "pf": ["replay.alpha=0.8"]}
    raw = _raw(variants=three, profiles={"ci": {"variants": {"per": None, "pf2": ["replay.alpha=1.0"]}}})
    spec = parse_sweep(raw, profile="ci")
    assert spec.variants == {"uniform": ("replay.sampling=uniform",), "pf": ("replay.alpha=0.8",),
                             "pf2": ("replay.alpha=1.0",)}
    assert [r.variant for r in plan_runs(spec)] == [v for v in ("uniform", "pf", "pf2") for _ in range(5)]
    assert set(parse_sweep(raw).variants) == {"uniform", "per", "pf"}
    with pytest.raises(SweepError, match=r"profiles\.ci\.variants: 'pre' is set to null .* no such variant"):
        parse_sweep(_raw(profiles={"ci": {"variants": {"pre": None}}}), profile="ci")
    with pytest.raises(SweepError, match=r"'uniform' is not a variant"):
        parse_sweep(_raw(profiles={"ci": {"variants": {"uniform": None}}}), profile="ci")


def test_cli_rejects_a_bad_sweep_before_any_run(tmp_path, capsys):
    from jaxppo.cli.sweep import main

    out = tmp_path / "sweep_out"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_raw(output_dir=str(out),
                                     variants={"uniform": [], "per": ["replay.alpah=0.6"]})))
    assert main(["--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "variant 'per' seed 0" in err and "replay.alpah" in err and "replay.alpha" in err
    assert not out.exists()


def test_shipped_sweep_files_and_their_ci_profiles_plan(monkeypatch):
    monkeypatch.chdir(REPO)
    files = sorted((REPO / "configs" / "sweeps").glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        for profile in (None, "ci"):
            spec = load_sweep(f, profile=profile) if profile is None else _quiet(load_sweep, f, profile=profile)
            if profile is None:
                assert len(spec.seeds) >= 5, f
            runs = plan_runs(spec)
            assert len(runs) == len(spec.seeds) * len(spec.variants)


def _quiet(fn, *a, **kw):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(*a, **kw)


def test_a_coarse_grid_warns():
    with pytest.warns(UserWarning, match=r"4 evaluation points after step 0 \(< 8"):
        parse_sweep(_raw(budget={"samples": 256}))


def test_dpo_sweeps_seed_the_batch_order_and_count_pairs():
    """command: dpo -> the seed also sets data.seed (DPO's batch order) and dpo.batch_size is the batch key."""
    base = str(REPO / "configs" / "dpo_hh_stories260k.yaml")
    spec = parse_sweep(_raw(base=base, command="dpo", variants={"a": [], "b": ["dpo.beta=0.2"]}, baseline="a",
                            eval={"every_samples": 64}, budget={"samples": 512}))
    assert spec.seed_keys == ("trainer.seed", "data.seed") and spec.batch_key == "dpo.batch_size"
    runs = plan_runs(spec)
    r = runs[3]
    assert r.module == "jaxppo.dpo" and "data.seed=3" in r.overrides and "trainer.seed=3" in r.overrides
    assert r.config["data"]["seed"] == 3 and r.batch_size == r.config["dpo"]["batch_size"]
    assert r.total_steps == 512 // r.batch_size


def test_the_default_output_dir_is_committed_under_results():
    assert parse_sweep({k: v for k, v in _raw().items() if k != "output_dir"}).output_dir == "results/sweeps/sweep"
