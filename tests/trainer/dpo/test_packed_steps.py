"""The packed DPO step (``data.packing``): per loss type the same loss, metrics and gradients as the padded step on
random lengths (float32, 1e-5); the host plan's layout; a few trainer steps packed vs padded (every logged metric and
the parameters); 1 vs 8 devices. Adapter dropout draws its masks over the layout's shape, so packed and padded
steps are compared with dropout off (module doc of ``jaxppo.trainer.dpo.steps``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxppo.models.packing import pack_shared
from jaxppo.trainer.dpo.steps import DPOHParams, DPOState, make_dpo_step, plan_pairs
from jaxppo.trainer.micro import strided_split

from .conftest import dpo_overrides

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

B, P, R, MB = 8, 6, 5, 4
# the trainer comparisons' learning rate: Adam's first steps move a parameter by ~lr whatever its gradient's size,
# so a gradient entry that is float32 noise (~1e-7) moves by up to lr differently in the two layouts; at 1e-4 that
# stays below the 1e-5 tolerance (at TINY's 1e-3 one entry of 55040 differed by 1.3e-5 after 3 steps)
LR = "actor.optim.lr=1e-4"
TOL = dict(rtol=1e-5, atol=1e-5)
LOSSES = [("sigmoid", 0.0, 0.0), ("sigmoid", 0.1, 0.5), ("hinge", 0.0, 0.0), ("ipo", 0.0, 0.0),
          ("robust", 0.1, 0.0), ("sigmoid_norm", 0.0, 0.0), ("kto", 0.0, 0.0)]


@pytest.fixture(scope="module")
def model(stories_model):
    from jaxppo.hf import load_pretrained

    return load_pretrained(stories_model)


def _batch(v: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``B`` pairs of random lengths (prompts 1..P, answers 0..R tokens)."""
    rng = np.random.default_rng(seed)
    lp = rng.integers(1, P + 1, B)
    pm = (np.arange(P)[None] >= (P - lp)[:, None]).astype(np.int32)
    masks = [(np.arange(R)[None] < rng.integers(0, R + 1, B)[:, None]).astype(np.int32) for _ in range(2)]
    ids = lambda m: (rng.integers(1, v, m.shape) * m).astype(np.int32)  # noqa: E731
    return {"prompt_ids": ids(pm), "prompt_mask": pm, "chosen_ids": ids(masks[0]), "chosen_mask": masks[0],
            "rejected_ids": ids(masks[1]), "rejected_mask": masks[1],
            "ref_chosen": rng.normal(-20, 3, B).astype(np.float32),
            "ref_rejected": rng.normal(-20, 3, B).astype(np.float32), "desirable": rng.random(B) < 0.5}


def _sgd_state(params):
    """Plain SGD at lr 1 (an injected learning rate, as the step sets it): ``params − new params`` is the gradient."""
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0)
    z = lambda dt: jnp.zeros((), dt)  # noqa: E731
    state = DPOState(step=z(jnp.int32), actor=params, actor_opt=tx.init(params), lr_scale=jnp.ones((), jnp.float32),
                     nan_total=z(jnp.int32), nan_streak=z(jnp.int32), data_cursor=z(jnp.int32))
    return tx, state


def _close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), **(tol or TOL))


def test_plan_hands_each_micro_batch_its_chosen_then_rejected_rows(model):
    """Micro-batch ``j`` (pairs ``j, j+n, ...``) finds its own plan (its pairs' prompts once, then chosen and
    rejected answers) in the strided split of the whole batch's plan; each pair's tokens are its prompt's real
    tokens once and both answers', so the packed slots hold fewer tokens than the ``[2B]`` stack's."""
    batch = _batch(model.config.vocab_size)
    plan = plan_pairs(batch, MB, multiple_of=2)
    n = B // MB
    assert plan.response_index.shape == (2 * B, R) and plan.ids.shape[0] % (2 * n) == 0
    assert plan.ids.shape[1] == P + 2 * R and plan.branch_ids.shape == plan.ids.shape
    for j in range(n):
        mine = {k: v[j::n] for k, v in batch.items()}      # micro-batch j: pairs j, j+n, ...
        own = pack_shared(mine["prompt_ids"], mine["prompt_mask"],
                          np.stack([mine["chosen_ids"], mine["rejected_ids"]], 1),
                          np.stack([mine["chosen_mask"], mine["rejected_mask"]], 1), multiple_of=2)
        got = plan._make(None if a is None else np.asarray(strided_split(np.asarray(a), n))[j] for a in plan)
        for name in ("ids", "segment_ids", "positions", "branch_ids"):
            np.testing.assert_array_equal(getattr(got, name)[:own.ids.shape[0]], getattr(own, name))
        for name in ("response_index", "token_index", "last_index"):
            np.testing.assert_array_equal(getattr(got, name), getattr(own, name))
    real = batch["prompt_mask"].sum() + batch["chosen_mask"].sum() + batch["rejected_mask"].sum()
    assert (plan.segment_ids > 0).sum() == real


def _grad_close(g0, g1, rel: float = 1e-5):
    """Gradients within ``rel`` of their own scale: ``max|g1 − g0| <= rel · max(1, max|g0|)`` (IPO's squared loss
    gives gradients of order 1, whose float32 summation-order noise is above 1e-5 absolute)."""
    scale = max(1.0, max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g0)))
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))
    assert worst <= rel * scale, (worst, scale)


def test_packed_loss_equals_padded_per_loss_type(model):
    """Every loss type of the family (``dpo.loss_type``; sigmoid also with label smoothing and RPO): the loss, every
    metric and the gradient of ``pair_loss`` on packed rows equal the padded (shared-prefix) layout's, float32."""
    from jaxppo.optim import split_params
    from jaxppo.trainer.dpo.steps import pair_loss

    gd, params = split_params(model)
    batch = _batch(model.config.vocab_size, seed=1)
    hps = [DPOHParams(beta=0.1, loss_type=t, label_smoothing=e, rpo_alpha=a, micro_batch_size=B) for t, e, a in LOSSES]
    tpp = jnp.maximum(batch["chosen_mask"].sum(), 1) / B

    @jax.jit
    def all_losses(q, x):     # one program per layout for every loss type
        return [jax.value_and_grad(lambda p, hp=hp: pair_loss(gd, p, x, hp, tpp), has_aux=True)(q) for hp in hps]

    padded = all_losses(params, batch)
    packed = all_losses(params, dict(batch, packed=plan_pairs(batch, B)))
    for hp, ((l0, m0), g0), ((l1, m1), g1) in zip(hps, padded, packed):
        assert set(m0) == set(m1)
        for k in m0:
            np.testing.assert_allclose(float(m1[k]), float(m0[k]), err_msg=f"{hp.loss_type} {k}", **TOL)
        _grad_close(g0, g1)
        assert max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g0)) > 1e-4


@pytest.mark.parametrize("lora", [pytest.param(False, marks=pytest.mark.slow), True])
def test_packed_step_equals_padded_in_micro_batches(model, stories_model, lora):
    """The jitted step (2 strided micro-batches, RPO's whole-batch token mean; LoRA adapters on the frozen base,
    dropout off, or full weights, marked slow: the trainer comparison below also runs full weights in micro-batches):
    loss, every metric and the gradient (plain SGD at lr 1: ``params − new params``) of the packed step equal the
    padded step's. The adapters' gradients (of order 10-40 here) agree within 5e-5 of
    their scale, not 1e-5: the padded step's shared-prefix layout itself differs from the ``[2B, P+R]`` stack by
    ~1e-5 of their norm in float32 (measured), while the packed rows are within 1e-6 of the stack."""
    from jaxppo.optim import split_params

    base = None
    if lora:
        from jaxppo.hf import load_pretrained
        from jaxppo.models.adapters import attach_lora, split_frozen
        from jaxppo.models.lora import LoraSpec

        gd, params, base = split_frozen(attach_lora(load_pretrained(stories_model), LoraSpec(rank=2)))
        # B = 0 at init: give the adapters values so that both factors get gradients
        params = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape, x.dtype),
                              params)
    else:
        gd, params = split_params(model)
    batch = _batch(model.config.vocab_size, seed=2)
    batch.pop("desirable")
    hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.1, rpo_alpha=0.5, micro_batch_size=MB)
    tx, state = _sgd_state(params)
    step = make_dpo_step(gd, tx, optax.constant_schedule(1.0), hp, base=base)
    s0, m0 = step(jax.tree.map(jnp.copy, state), batch)
    s1, m1 = step(jax.tree.map(jnp.copy, state), dict(batch, packed=plan_pairs(batch, MB)))
    assert set(m0) == set(m1)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), err_msg=k, **TOL)
    g0 = jax.tree.map(jnp.subtract, params, s0.actor)
    _grad_close(g0, jax.tree.map(jnp.subtract, params, s1.actor), 5e-5 if lora else 1e-5)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(g0))
    assert int(s1.data_cursor) == B


def _run(cfg_args, devices):
    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, make_batch

    run = build_dpo_run(load_config(None, cfg_args), devices=devices)
    return run, make_batch


def _steps(run, make_batch, n):
    state, out = run.state, []
    for _ in range(n):
        batch = make_batch(run, int(jax.device_get(state.data_cursor)))
        state, m = run.step(state, batch)
        out.append({k: float(v) for k, v in jax.device_get(m).items()})
    return state, out


def _same_metrics(rows0, rows1):
    """Logged rows (``metrics.jsonl``) of the padded and packed runs: the same keys, every value within 1e-5 but the
    timings, and the accuracies while the policy is still the reference (module doc of the harness: step 0's
    evaluation and step 1's batch, ``DPO.initial_metrics``), whose implicit rewards are float noise around 0: which pairs that noise puts
    right depends on the summation order."""
    assert len(rows0) == len(rows1) >= 2
    for a, b in zip(rows0, rows1):
        assert set(a) == set(b)
        for k, v in a.items():
            if k.startswith("perf/") or (a["step"] <= 1 and k.endswith("accuracies")):
                continue
            if isinstance(v, float):
                np.testing.assert_allclose(b[k], v, err_msg=f"step {a['step']} {k}", **TOL)


def test_trainer_runs_packed_equal_padded(tmp_path, stories_model, hh_pairs):
    """``train_dpo`` with ``data.packing`` on and off: every logged metric of 3 steps (the evaluations at steps 0
    and 3 included; timings excepted) and the final parameters agree within 1e-5; the packed update compiled a
    bounded number of programs."""
    import json

    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, fit_dpo

    cache = tmp_path / "cache"
    out = {}
    for packing in (False, True):
        args = dpo_overrides(stories_model, hh_pairs, tmp_path / f"run_{packing}", cache, LR, "trainer.total_steps=3",
                             "trainer.eval_every=3", "trainer.save_every=3", f"data.packing={str(packing).lower()}")
        cfg = load_config(None, args)
        run = build_dpo_run(cfg, devices=jax.devices()[:1])
        assert ("packed" in run.batch_shardings) == packing
        _, state = fit_dpo(cfg, run=run)
        rows = [json.loads(line) for line in (tmp_path / f"run_{packing}" / "metrics.jsonl").read_text().splitlines()]
        out[packing] = (rows, state, run)
    (r0, s0, _), (r1, s1, run1) = out[False], out[True]
    assert len(r0) == len(r1) >= 3
    _same_metrics(r0, r1)
    _close(s0.actor, s1.actor)
    assert 1 <= len(run1.programs.shapes) <= 8


def test_packed_step_one_and_eight_devices_agree(tmp_path, stories_model, hh_pairs):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    common = dpo_overrides(stories_model, hh_pairs, tmp_path / "o", tmp_path / "cache", "data.packing=true")
    r1, mb = _run([*common, "mesh.data=1"], jax.devices()[:1])
    r8, _ = _run([*common, "mesh.data=2", "mesh.fsdp=4"], jax.devices()[:8])
    s1, m1 = _steps(r1, mb, 2)
    s8, m8 = _steps(r8, mb, 2)
    for step, (a, b) in enumerate(zip(m1, m8), 1):
        for k in a:
            if step == 1 and k.endswith("accuracies"):   # the policy is the reference: float noise (_same_metrics)
                continue
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5, err_msg=f"step {step} {k}")
