"""The DPO step: loss vs an independent numpy reference (jitted and not), micro-batches, NaN skip, batch order."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.trainer.dpo.steps import (
    DPOHParams,
    DPOState,
    batch_indices,
    make_dpo_step,
    pair_loss,
)

B, P, R = 4, 6, 5


@pytest.fixture(scope="module")
def model(stories_model):
    from jaxppo.hf import load_pretrained

    return load_pretrained(stories_model)


@pytest.fixture(scope="module")
def batch(model):
    rng = np.random.default_rng(0)
    v = model.config.vocab_size
    pm = np.ones((B, P), np.int32)
    pm[0, :2] = 0  # left padding
    cm = np.ones((B, R), np.int32)
    cm[1, 3:] = 0  # right padding
    rm = np.ones((B, R), np.int32)
    rm[2, 2:] = 0
    return {"prompt_ids": rng.integers(1, v, (B, P)).astype(np.int32), "prompt_mask": pm,
            "chosen_ids": rng.integers(1, v, (B, R)).astype(np.int32), "chosen_mask": cm,
            "rejected_ids": rng.integers(1, v, (B, R)).astype(np.int32), "rejected_mask": rm,
            "ref_chosen": rng.normal(-40, 3, B).astype(np.float32),
            "ref_rejected": rng.normal(-40, 3, B).astype(np.float32)}


def _np_seq_logp(model, p_ids, p_mask, r_ids, r_mask) -> np.ndarray:
    """Independent reference: full-sequence logits, numpy log-softmax in float64, gather, masked sum."""
    ids = np.concatenate([p_ids, r_ids], 1)
    mask = np.concatenate([p_mask, r_mask], 1)
    z = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)), np.float64)[:, P - 1:P + R - 1]
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    tok = np.take_along_axis(logp, r_ids[..., None], -1)[..., 0]
    return (tok * r_mask).sum(1)


def _np_sigmoid_loss(pc, pr, rc, rr, beta, eps):
    d = beta * ((pc - rc) - (pr - rr))
    ls = lambda x: -np.logaddexp(0.0, -x)  # noqa: E731  log sigmoid
    return float(np.mean(-(1 - eps) * ls(d) - eps * ls(-d)))


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_pair_loss_matches_numpy(model, batch, eps):
    from jaxppo.optim import split_params

    gd, params = split_params(model)
    hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=eps, rpo_alpha=0.0, micro_batch_size=B)
    pc = _np_seq_logp(model, batch["prompt_ids"], batch["prompt_mask"], batch["chosen_ids"], batch["chosen_mask"])
    pr = _np_seq_logp(model, batch["prompt_ids"], batch["prompt_mask"], batch["rejected_ids"], batch["rejected_mask"])
    loss, m = pair_loss(gd, params, batch, hp)  # un-jitted and jitted (explicit jax.jit)
    loss_j, m_j = jax.jit(lambda p, b: pair_loss(gd, p, b, hp))(params, batch)
    want = _np_sigmoid_loss(pc, pr, batch["ref_chosen"], batch["ref_rejected"], 0.1, eps)
    for lo, mm in ((loss, m), (loss_j, m_j)):
        np.testing.assert_allclose(float(lo), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(mm["logps/chosen"]), pc.mean(), rtol=1e-4)
        np.testing.assert_allclose(float(mm["logps/rejected"]), pr.mean(), rtol=1e-4)
        acc = np.mean((pc - batch["ref_chosen"]) > (pr - batch["ref_rejected"]))
        np.testing.assert_allclose(float(mm["rewards/accuracies"]), acc)


def test_policy_equal_to_reference_gives_log2(model, batch):
    """Hand-computed: with ref = the policy's own log-probs, D = 0 and the sigmoid loss is log 2 for any beta."""
    from jaxppo.optim import split_params

    gd, params = split_params(model)
    pc = _np_seq_logp(model, batch["prompt_ids"], batch["prompt_mask"], batch["chosen_ids"], batch["chosen_mask"])
    pr = _np_seq_logp(model, batch["prompt_ids"], batch["prompt_mask"], batch["rejected_ids"], batch["rejected_mask"])
    b = dict(batch, ref_chosen=pc.astype(np.float32), ref_rejected=pr.astype(np.float32))
    hp = DPOHParams(beta=0.5, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=0.0, micro_batch_size=B)
    loss, m = jax.jit(lambda p, x: pair_loss(gd, p, x, hp))(params, b)
    assert abs(float(loss) - math.log(2.0)) < 1e-4
    assert abs(float(m["rewards/margins"])) < 1e-4


def _state(params, tx):
    z = lambda dt: jnp.zeros((), dt)  # noqa: E731
    return DPOState(step=z(jnp.int32), actor=params, actor_opt=tx.init(params), lr_scale=jnp.ones((), jnp.float32),
                    nan_total=z(jnp.int32), nan_streak=z(jnp.int32), data_cursor=z(jnp.int32))


def _copy(tree):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


@pytest.mark.parametrize("rpo_alpha", [0.0, 0.5])
def test_micro_batches_equal_full_batch(model, batch, rpo_alpha):
    """Also with RPO: its NLL is a token mean over the whole batch (TRL), whatever the micro-batch split."""
    from jaxppo.config.schema import OptimConfig
    from jaxppo.optim import make_optimizer, split_params

    gd, params = split_params(model)
    # eps=1 makes AdamW's first update ~ lr x g (linear in the gradient, no sign amplification of float noise)
    cfg = OptimConfig(lr=1.0, eps=1.0)
    tx = make_optimizer(cfg, 10)
    sched = optax.constant_schedule(1.0)
    out = {}
    for mb in (B, 2):
        hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=rpo_alpha, micro_batch_size=mb)
        st_, m = make_dpo_step(gd, tx, sched, hp)(_state(_copy(params), tx), batch)
        out[mb] = (st_, m)
    (sa, ma), (sb, mb_) = out[B], out[2]
    for k in ("loss", "rewards/accuracies", "logps/chosen", "grad_norm", *(("nll_loss",) if rpo_alpha else ())):
        np.testing.assert_allclose(float(ma[k]), float(mb_[k]), rtol=1e-4, atol=1e-6)
    if rpo_alpha:   # the batch's token-mean NLL of the chosen answers
        n = np.asarray(batch["chosen_mask"]).sum()
        want = -float(ma["logps/chosen"]) * B / n
        np.testing.assert_allclose(float(ma["nll_loss"]), want, rtol=1e-4)
    chex.assert_trees_all_close(sa.actor, sb.actor, rtol=1e-4, atol=1e-6)
    assert int(sa.step) == 1 and int(sa.data_cursor) == B
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(sa.actor), jax.tree.leaves(params)))
    assert moved > 1e-3


def test_micro_batches_are_strided(model, batch, monkeypatch):
    """Micro-batch ``j`` of a ``B``-pair batch cut into ``n`` holds pairs ``j, j+n, ...`` (the split of every trainer,
    ``jaxppo.trainer.micro``): under batch sharding each micro-batch then spreads over all devices. The pairs each
    micro-batch's loss sees are recorded (tagged by ``ref_chosen``)."""
    from jaxppo.config.schema import OptimConfig
    from jaxppo.optim import make_optimizer, split_params
    from jaxppo.trainer.dpo import steps as step_mod

    seen = []

    def recording_loss(graphdef, params, x, hp, rpo_tokens_per_pair=None):
        jax.debug.callback(lambda tags: seen.append(np.asarray(tags).astype(int).tolist()), x["ref_chosen"],
                           ordered=True)
        loss = sum(jnp.sum(p) for p in jax.tree.leaves(params)) * 0.0 + jnp.mean(x["ref_chosen"])
        return loss, {"loss": loss}

    monkeypatch.setattr(step_mod, "pair_loss", recording_loss)
    gd, params = split_params(model)
    tx = make_optimizer(OptimConfig(lr=1e-3), 10)
    hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=0.0, micro_batch_size=2)
    tagged = dict(batch, ref_chosen=np.arange(B, dtype=np.float32))
    fn = make_dpo_step(gd, tx, optax.constant_schedule(1e-3), hp)
    _, m = fn(_state(_copy(params), tx), tagged)
    jax.effects_barrier()
    assert seen == [[0, 2], [1, 3]]          # strided; a contiguous split would give [[0, 1], [2, 3]]
    assert float(m["loss"]) == pytest.approx(np.mean(np.arange(B)))   # the mean of the micro-batch means


def test_nan_batch_is_skipped_in_graph(model, batch):
    from jaxppo.config.schema import OptimConfig
    from jaxppo.optim import make_optimizer, split_params

    gd, params = split_params(model)
    tx = make_optimizer(OptimConfig(lr=1e-2), 10)
    hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=0.0, micro_batch_size=B)
    step = make_dpo_step(gd, tx, optax.constant_schedule(1e-2), hp)
    bad = dict(batch, ref_chosen=np.full(B, np.nan, np.float32))
    s1, m1 = step(_state(_copy(params), tx), bad)
    assert float(m1["train/nan_skipped"]) == 1.0
    assert int(s1.nan_total) == 1 and int(s1.nan_streak) == 1 and int(s1.step) == 1
    chex.assert_trees_all_equal(s1.actor, params)
    s2, m2 = step(s1, batch)
    assert float(m2["train/nan_skipped"]) == 0.0 and int(s2.nan_streak) == 0 and int(s2.nan_total) == 1


@given(seed=st.integers(0, 5), n=st.integers(1, 13), bs=st.integers(1, 9), k=st.integers(1, 4))
def test_batch_order_is_shuffled_epochs_and_a_function_of_the_cursor(seed, n, bs, k):
    stream = np.concatenate([batch_indices(seed, i * bs, bs, n) for i in range(k)])
    np.testing.assert_array_equal(stream, batch_indices(seed, 0, k * bs, n))  # resume from any cursor
    for e in range(len(stream) // n):  # every full epoch is a permutation of the pairs
        assert sorted(stream[e * n:(e + 1) * n].tolist()) == list(range(n))
    want = np.asarray(jax.random.permutation(jax.random.fold_in(jax.random.PRNGKey(seed), 0), n))
    np.testing.assert_array_equal(stream[:min(n, len(stream))], want[:min(n, len(stream))])


def test_batch_indices_bad_input():
    with pytest.raises(ValueError, match="no pairs"):
        batch_indices(0, 0, 4, 0)
    with pytest.raises(ValueError, match="cursor"):
        batch_indices(0, -1, 4, 5)


@pytest.mark.slow
def test_lora_dropout_acts_in_the_dpo_update_only(stories_model, batch):
    """Adapter dropout (p = 0.3) in the DPO step: the loss of step 1 is p = 0's (B = 0 at start) but the adapter
    gradients read the dropped inputs, the same seed gives the same step, the log-probs outside the update are p = 0's
    exactly, and p = 0 traces no random operation."""
    from jaxppo.config.schema import OptimConfig
    from jaxppo.hf import load_pretrained
    from jaxppo.models.adapters import attach_lora, split_frozen
    from jaxppo.models.lora import LoraSpec
    from jaxppo.optim import make_optimizer
    from tests.models.test_lora_dropout import count_random_ops

    tx = make_optimizer(OptimConfig(lr=1e-2), 10)
    hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=0.0, micro_batch_size=2)
    runs = {}
    for p in (0.0, 0.3):
        gd, params, base = split_frozen(attach_lora(load_pretrained(stories_model), LoraSpec(rank=2, dropout=p)))
        fn = make_dpo_step(gd, tx, optax.constant_schedule(1e-2), hp, base=base, lora_dropout=p, seed=3)
        runs[p] = (gd, params, base, fn)

    def two_steps(p):
        gd, params, base, fn = runs[p]
        s1, m1 = fn(_state(_copy(params), tx), batch)
        s2, m2 = fn(s1, batch)
        return [{k: float(v) for k, v in m.items()} for m in (m1, m2)], s2

    (m0, _), (mp, sp) = two_steps(0.0), two_steps(0.3)
    assert two_steps(0.3)[0] == mp                                  # deterministic
    assert mp[0]["loss"] == pytest.approx(m0[0]["loss"], rel=1e-6)
    assert abs(mp[0]["grad_norm"] - m0[0]["grad_norm"]) > 1e-3 * m0[0]["grad_norm"]
    assert mp[1]["loss"] != pytest.approx(m0[1]["loss"], rel=1e-5)
    # outside the update (no key): the p = 0.3 model's log-probs are the p = 0 model's for the same adapters
    gd0, _, base0, _ = runs[0.0]
    gdp, _, basep, _ = runs[0.3]
    lp0 = jax.jit(lambda a: pair_loss(gd0, (a, base0), batch, hp)[1])(sp.actor)
    lpp = jax.jit(lambda a: pair_loss(gdp, (a, basep), batch, hp)[1])(sp.actor)
    assert {k: float(v) for k, v in lp0.items()} == {k: float(v) for k, v in lpp.items()}
    gd, params, base, fn0 = runs[0.0]
    assert count_random_ops(lambda s: fn0(s, batch), _state(params, tx)) == 0
    assert count_random_ops(lambda s: runs[0.3][3](s, batch), _state(params, tx)) > 0
