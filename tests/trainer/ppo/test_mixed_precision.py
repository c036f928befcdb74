"""bfloat16 compute in the PPO step: log-probs, entropies, values, ratios, KL, advantages, every loss term and
metric, the gradients and the optimizer updates stay float32 (jit and no-jit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxppo import ops
from jaxppo.models import CausalLM
from jaxppo.models.heads import ScalarHead, ValueModel
from jaxppo.optim import make_optimizer
from jaxppo.trainer.ppo.forward import logp_entropy, response_logits_values
from jaxppo.trainer.ppo.steps import actor_terms, critic_terms
from tests.models.tiny_lm import tiny_config
from tests.trainer._batch import as_batch
from tests.trainer.ppo.test_step_terms import _cfg

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
F32 = jnp.dtype(jnp.float32)


def _batch(b=4, p=3, r=5, v=61, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, r), np.int32)
    mask[1, 3:] = 0
    lp = lambda: (-rng.uniform(0.5, 5.0, size=(b, r)) * mask).astype(np.float32)  # noqa: E731
    return as_batch({
        "prompt_ids": rng.integers(1, v, size=(b, p)).astype(np.int32), "prompt_mask": np.ones((b, p), np.int32),
        "response_ids": rng.integers(1, v, size=(b, r)).astype(np.int32), "response_mask": mask,
        "prox_logp": lp(), "ref_logp": lp(), "behaviour_logprobs": lp(),
        "advantages": (rng.normal(size=(b, r)) * mask).astype(np.float32),
        "returns": (rng.normal(size=(b, r)) * mask).astype(np.float32),
        "values": (rng.normal(size=(b, r)) * mask).astype(np.float32),
        "token_rewards": (rng.normal(size=(b, r)) * mask).astype(np.float32),
        "score": rng.normal(size=(b,)).astype(np.float32)})


def _models(share_trunk: bool):
    cfg = tiny_config("smollm2", compute_dtype="bfloat16")
    actor = CausalLM(cfg, rngs=nnx.Rngs(0))
    critic = (ScalarHead(cfg.hidden_size, rngs=nnx.Rngs(1)) if share_trunk
              else ValueModel.from_lm(actor, rngs=nnx.Rngs(1)))
    return nnx.split(actor), nnx.split(critic)


HP = dict(overrides=("importance.enabled=true", "algorithm.kl_penalty=k3", "actor.use_kl_loss=true",
                     "actor.entropy_coeff=0.01"))


def _terms(hp, batch, logits, values):
    """Every float quantity of the step computed from the model outputs (log-probs, entropy, ratio, KL, GAE
    advantages/returns from bf16 values, the actor and critic terms with all their metrics)."""
    w = jnp.ones(batch.data.response_mask.shape[0])
    m = batch.data.response_mask
    logp, ent = logp_entropy(logits, batch.data.response_ids, m)
    adv, ret = ops.gae(batch.prepared.token_rewards, values.astype(jnp.bfloat16), m, 1.0, 0.95)  # promotes
    la, aux_a = actor_terms(hp, logits, batch, w)
    lc, aux_c, prio = critic_terms(hp, values, batch, w)
    return la + lc, {"logp": logp, "entropy": ent, "ratio": jnp.exp(logp - batch.prepared.prox_logp),
                     "kl": ops.kl_penalty(logp, batch.data.ref_logp, "k3"), "adv": adv, "returns": ret,
                     "actor_loss": la, "critic_loss": lc, "priority": prio, **aux_a, **aux_c}


def _not_f32(tree: dict) -> dict:
    return {k: str(jnp.asarray(v).dtype) for k, v in tree.items() if jnp.asarray(v).dtype != F32}


@pytest.mark.parametrize("jit", [False, True])
def test_bf16_compute_ratios_kl_losses_are_float32(jit):
    """From a bf16-compute model's outputs, every loss-side quantity is float32, eager and under jit."""
    (agd, ap), (cgd, cp) = _models(share_trunk=False)
    hp, batch = _cfg(*HP["overrides"]), _batch()
    fwd = jax.jit(lambda a, c, d: response_logits_values(agd, a, cgd, c, d, share_trunk=False))
    logits, values = fwd(ap, cp, batch.data)
    assert logits.dtype == F32 and values.dtype == F32
    fn = jax.jit(_terms, static_argnums=0) if jit else _terms
    total, q = fn(hp, batch, logits, values)
    assert not _not_f32({"total": total, **q}), _not_f32({"total": total, **q})
    assert all(bool(jnp.all(jnp.isfinite(jnp.asarray(v)))) for v in jax.tree.leaves(q))


@pytest.mark.parametrize("share_trunk", [pytest.param(False, marks=pytest.mark.slow), True])  # False: ~30 s
def test_bf16_compute_grads_and_optimizer_updates_are_float32(share_trunk):
    """The whole differentiated step under jit: float32 loss and metrics, float32 gradients of the float32
    master weights, float32 Adam updates and parameters after ``optax.apply_updates``."""
    (agd, ap), (cgd, cp) = _models(share_trunk)
    hp, batch = _cfg(*HP["overrides"]), _batch()

    def loss(ap, cp, batch):
        logits, values = response_logits_values(agd, ap, cgd, cp, batch.data, share_trunk=share_trunk)
        return _terms(hp, batch, logits, values)

    (total, q), (ga, gc) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(ap, cp, batch)
    assert not _not_f32({"total": total, **q}), _not_f32({"total": total, **q})
    grads = jax.tree.leaves((ga, gc))
    assert {g.dtype for g in grads} == {F32}
    assert all(float(jnp.sum(jnp.abs(g))) > 0 for g in jax.tree.leaves(ga))
    tx = make_optimizer(_optim_cfg(), 10)
    updates, _ = jax.jit(tx.update)(ga, tx.init(ap), ap)
    assert {u.dtype for u in jax.tree.leaves(updates)} == {F32}
    assert {x.dtype for x in jax.tree.leaves(optax.apply_updates(ap, updates))} == {F32}


def _optim_cfg():
    from jaxppo.config import load_config

    return load_config(None, []).actor.optim


def test_bf16_parameters_train_on_a_float32_master_and_resume(make_cfg, tmp_path):
    """``model.param_dtype=bfloat16`` with full weights: the optimizer keeps a float32 master of the actor and critic
    (``jaxppo.optim.with_master_weights``), the stored bf16 parameters are exactly the rounded master after every
    checkpointed step, the master moves by more than the bf16 weights do, and a run resumed from checkpoint 2
    (the master restored with the rest of the optimizer state) repeats the uninterrupted run's metrics exactly."""
    import shutil

    from jaxppo.optim import MasterState
    from jaxppo.trainer.checkpoint import Checkpointer
    from jaxppo.trainer.ppo.algorithm import train
    from jaxppo.trainer.ppo.build import build_run
    from tests.resume_helpers import deterministic_rows

    cfg = make_cfg("model.param_dtype=bfloat16", "data.eval_fraction=0", "trainer.total_steps=4",
                   "trainer.save_every=2", "trainer.keep_last=3", "actor.optim.lr=1e-5")
    run = build_run(cfg, devices=jax.devices()[:1])
    init = run.state
    assert isinstance(init.actor_opt, MasterState) and isinstance(init.critic_opt, MasterState)
    assert {x.dtype for x in jax.tree.leaves(init.actor)} == {jnp.dtype(jnp.bfloat16)}
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), init)
    start = [np.asarray(x, np.float32) for x in jax.tree.leaves(init.actor)]   # the step donates the state
    train(cfg, run=run)
    out = tmp_path / "run"
    first = deterministic_rows(out)
    ck = Checkpointer(out / "checkpoints", keep_last=3, async_save=False)
    state, _ = ck.restore(4, like)
    ck.close()
    for params, opt in ((state.actor, state.actor_opt), (state.critic, state.critic_opt)):
        rounded = jax.tree.map(lambda m: m.astype(jnp.bfloat16), opt.master)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                   zip(jax.tree.leaves(params), jax.tree.leaves(rounded)))
    moved_master = [np.mean(np.asarray(m) != np.asarray(s)) for m, s in zip(jax.tree.leaves(state.actor_opt.master), start)]
    moved_bf16 = [np.mean(np.asarray(p, np.float32) != np.asarray(s)) for p, s in zip(jax.tree.leaves(state.actor), start)]
    # lr 1e-5 on weights ~0.02-1: the master changes nearly everywhere, most bf16 weights not yet
    assert np.mean(moved_master) > 0.9 and np.mean(moved_bf16) < np.mean(moved_master)
    shutil.rmtree(out / "checkpoints" / "4")
    summary = train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    assert summary["resumed_from"] == 2
    assert deterministic_rows(out) == first
