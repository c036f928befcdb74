"""jaxppo.models: rope tables, padding, remat/scan equivalence, logical axes, heads, sharding, config.

bf16 compute with fp32 params is tested on stories260K in tests/hf/test_load.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxppo.models import CausalLM, LMConfig, RewardModel, ValueModel, generate, named_shardings, shard_model
from jaxppo.models.sharding import fit_spec
from tests.models.tiny_lm import left_padded_prompts, tiny_config, tiny_lm


# ----------------------------------------------------------------------------- rotary frequencies

@pytest.mark.parametrize("rope", [
    dict(rope_type="default"),
    dict(rope_type="linear", factor=4.0),
    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=64),
])
def test_inv_freq_matches_transformers(rope):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=512,
                                  rope_parameters=dict(rope_theta=50000.0, **rope))
    if rope["rope_type"] == "default":
        expected = 1.0 / 50000.0 ** (np.arange(0, 32, 2) / 32)
    else:
        expected = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf)[0].numpy()
    ours = LMConfig.from_hf(hf.to_dict()).inv_freq()
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    if rope["rope_type"] == "llama3":  # the scaling really changes some frequencies, and keeps others
        plain = 1.0 / 50000.0 ** (np.arange(0, 32, 2) / 32)
        assert np.isclose(ours[0], plain[0]) and np.isclose(ours[-1], plain[-1] / 8, rtol=1e-5)


# ----------------------------------------------------------------------------- padding and equivalences

def test_left_padding_does_not_change_real_token_logits():
    model = tiny_lm("mistral", seed=1)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(7, 4), width=7, seed=0)
    padded = np.asarray(_jit_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    alone = np.asarray(_jit_forward(model, jnp.asarray(ids[1:, 3:]), jnp.ones((1, 4), jnp.int32)))
    np.testing.assert_allclose(padded[1, 3:], alone[0], atol=2e-5)
    assert np.isfinite(padded).all()  # fully masked pad queries do not produce NaN


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_continuation_logprobs_match_full_logits_log_softmax(family):
    """CausalLM.continuation_logprobs (LM head on the R response positions only, logsumexp form) against an
    independent numpy log-softmax of the full-sequence logits read at P-1 .. P+R-2; jitted and un-jitted."""
    from jaxppo.models.transformer import continuation_logprobs

    model = tiny_lm(family, seed=2)
    v = model.config.vocab_size
    p_ids, p_mask = left_padded_prompts(v, lengths=(5, 2, 1), width=5, seed=3)
    rng = np.random.default_rng(4)
    r_ids = rng.integers(3, v, size=(3, 4)).astype(np.int32)
    r_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], np.int32)
    r_ids = np.where(r_mask == 1, r_ids, 0).astype(np.int32)
    full = np.asarray(model(jnp.asarray(np.concatenate([p_ids, r_ids], 1)),
                            jnp.asarray(np.concatenate([p_mask, r_mask], 1))), np.float64)[:, 4:8]
    z = full - full.max(-1, keepdims=True)
    lsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expected = np.take_along_axis(lsm, r_ids[..., None], -1)[..., 0] * r_mask
    args = [jnp.asarray(a) for a in (p_ids, p_mask, r_ids, r_mask)]
    eager = np.asarray(model.continuation_logprobs(*args))
    gd, state = nnx.split(model)
    jitted = np.asarray(continuation_logprobs(gd, state, *args))
    for out in (eager, jitted):
        assert out.shape == (3, 4) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected, atol=2e-5)
        assert np.all(out[r_mask == 0] == 0) and np.all(out[r_mask == 1] < 0)


def test_continuation_logprobs_put_only_response_rows_through_the_lm_head():
    """The LM head GEMM of the compiled pass has B*R rows (not B*(P+R)): the saving over model(ids)[:, P-1:]."""
    import re

    from jaxppo.models.transformer import continuation_logprobs

    model = tiny_lm("llama")
    v = model.config.vocab_size
    b, p, r = 2, 6, 3
    gd, state = nnx.split(model)
    zeros = jnp.zeros((b, p), jnp.int32), jnp.ones((b, p), jnp.int32), jnp.zeros((b, r), jnp.int32)
    hlo = continuation_logprobs.lower(gd, state, *zeros, jnp.ones((b, r), jnp.int32)).compile().as_text()
    def head_rows(text):
        return {tuple(map(int, m.groups())) for m in re.finditer(r"f32\[(\d+),(\d+)\]\S* (?:dot|fusion)\(", text)
                if int(m.group(2)) == v}

    assert head_rows(hlo) == {(b * r, v)}
    # the check does see the head of a pass that computes every position's logits first
    whole = jax.jit(lambda ids, mask: model(ids, mask)[:, p - 1:])
    assert head_rows(whole.lower(jnp.zeros((b, p + r), jnp.int32), jnp.ones((b, p + r), jnp.int32))
                     .compile().as_text()) == {(b * (p + r), v)}


def _loss_and_grads(model, ids, mask):
    def loss(m):
        lp = jax.nn.log_softmax(m(ids, mask))
        return -jnp.mean(jnp.take_along_axis(lp[:, :-1], ids[:, 1:, None], -1))
    return nnx.value_and_grad(loss)(model)


_jit_loss_and_grads = nnx.jit(_loss_and_grads)
_jit_forward = nnx.jit(lambda m, ids, mask: m(ids, mask))


@pytest.mark.parametrize("remat,scan", [(True, True), (False, False), (True, False), (False, "auto"), ("dots", True),
                                        ("auto", True)])
def test_remat_and_unrolled_layers_give_same_loss_and_grads(remat, scan):
    """Against the scanned, non-remat model (explicitly scan_layers=True: the tiny model's "auto" unrolls on CPU)."""
    ids, mask = left_padded_prompts(61, lengths=(6, 3), width=6, seed=2)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    ref_model = tiny_lm("qwen2", seed=4, scan_layers=True, remat=False)
    other = tiny_lm("qwen2", seed=4, remat=remat, scan_layers=scan)
    assert not ref_model.config.unroll_layers and other.config.unroll_layers == (scan is not True)
    l0, g0 = _jit_loss_and_grads(ref_model, ids, mask)
    l1, g1 = _jit_loss_and_grads(other, ids, mask)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    flat0, flat1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(flat0) == len(flat1) > 5
    for a, b in zip(flat0, flat1):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5)
    assert max(float(jnp.max(jnp.abs(a))) for a in flat0) > 1e-3


def test_remat_policy_resolution_and_bad_values():
    """"auto" saves only the products on the CPU for a scanned float32 stack, nothing when unrolled or in 16-bit
    compute; true / false / "dots" are taken as given; anything else is named."""
    assert jax.default_backend() == "cpu"
    cfg = lambda **kw: tiny_lm("llama", seed=0, **kw).config  # noqa: E731
    assert cfg(remat="auto", scan_layers=True).remat_policy == "dots"
    assert cfg(remat="auto", scan_layers=False).remat_policy is None
    assert cfg(remat="auto", scan_layers=True, compute_dtype="bfloat16").remat_policy is None
    assert cfg(remat="dots", scan_layers=False).remat_policy == "dots"
    assert cfg(remat=True).remat_policy == "full" and cfg(remat=False).remat_policy is None
    for bad in ("yes", "full", 1):
        with pytest.raises(ValueError, match="LMConfig.remat must be true, false, 'dots' or 'auto'"):
            cfg(remat=bad)


def _saved_residual_bytes(model, ids, mask):
    """Bytes of the residuals the backward keeps, from ``jax.ad_checkpoint.print_saved_residuals`` of the loss (one
    line per residual, starting with its type, e.g. ``f32[2,6,64]``)."""
    import contextlib
    import io
    import re

    from jax.ad_checkpoint import print_saved_residuals
    graphdef, state = nnx.split(model)

    def loss(state):
        m = nnx.merge(graphdef, state)
        return jnp.mean(m(ids, mask))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(loss, state)
    size = {"f32": 4, "i32": 4, "bf16": 2, "bool": 1}
    total = 0
    for dt, dims in re.findall(r"^(f32|i32|bf16|bool)\[([\d,]*)\]", out.getvalue(), re.M):
        total += size[dt] * int(np.prod([int(d) for d in dims.split(",") if d]))
    assert total > 0, out.getvalue()
    return total


def test_dots_remat_saves_less_than_no_remat_and_more_than_full():
    """The policy is real: saving only the products' outputs keeps fewer bytes for the backward than saving every
    activation, and more than recomputing whole layers."""
    ids, mask = left_padded_prompts(61, lengths=(6, 3), width=6, seed=2)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    got = {r: _saved_residual_bytes(tiny_lm("llama", seed=1, remat=r, scan_layers=True), ids, mask)
           for r in (False, "dots", True)}
    assert got[True] < got["dots"] < got[False], got


def test_unrolled_and_scanned_programs_really_differ():
    """The switch is real: the scanned program has a while loop over layers, the unrolled one none."""
    ids, mask = jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)
    texts = {}
    for scan in (True, False):
        model = tiny_lm("llama", scan_layers=scan)
        gd, state = nnx.split(model)
        f = jax.jit(lambda st, i, m, gd=gd: nnx.merge(gd, st)(i, m))
        texts[scan] = f.lower(state, ids, mask).as_text()
    assert "while" in texts[True] and "while" not in texts[False]


def test_unroll_layers_rule(monkeypatch):
    from jaxppo.models import config as config_mod

    assert tiny_config("llama", scan_layers=True).unroll_layers is False
    assert tiny_config("llama", scan_layers=False).unroll_layers is True
    assert tiny_config("llama").scan_layers == "auto"
    n = config_mod.AUTO_UNROLL_MAX_LAYERS
    assert tiny_config("llama", num_hidden_layers=n).unroll_layers is True  # tests run on the CPU backend
    assert tiny_config("llama", num_hidden_layers=n + 1).unroll_layers is False
    # 16-bit compute unrolls at any depth on the CPU (no bf16 dynamic-update-slice there: a scanned stack's
    # residual writes are whole-buffer float32 round trips), unless scan_layers=True says otherwise
    for dt in ("bfloat16", "float16"):
        assert tiny_config("llama", num_hidden_layers=n + 1, compute_dtype=dt).unroll_layers is True
        assert tiny_config("llama", num_hidden_layers=n + 1, compute_dtype=dt, scan_layers=True).unroll_layers is False
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert tiny_config("llama", num_hidden_layers=2).unroll_layers is False
    assert tiny_config("llama", num_hidden_layers=2, compute_dtype="bfloat16").unroll_layers is False


def test_attention_kv_heads_first_layout_matches_numpy():
    """attention() with keys/values [B, S, K, hd] and with [B, K, S, hd] (the cache layout) against a numpy
    grouped-query softmax attention; jitted and un-jitted."""
    from jaxppo.models.layers import attention

    rng = np.random.default_rng(0)
    b, t, s, h, kh, hd = 2, 3, 5, 4, 2, 8
    q = rng.normal(size=(b, t, h, hd)).astype(np.float32)
    k = rng.normal(size=(b, s, kh, hd)).astype(np.float32)
    v = rng.normal(size=(b, s, kh, hd)).astype(np.float32)
    allowed = rng.random((b, t, s)) < 0.7
    allowed[..., 0] = True
    ref = np.zeros((b, t, h, hd))
    for bi in range(b):
        for ti in range(t):
            for hi in range(h):
                kv = hi // (h // kh)
                sc = k[bi, :, kv].astype(np.float64) @ q[bi, ti, hi] / np.sqrt(hd)
                sc = np.where(allowed[bi, ti], sc, -np.inf)
                w = np.exp(sc - sc.max())
                ref[bi, ti, hi] = (w / w.sum()) @ v[bi, :, kv]
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    for fn in (attention, jax.jit(attention, static_argnames="kv_heads_first")):
        np.testing.assert_allclose(np.asarray(fn(q, k, v, allowed)), ref, atol=1e-5)
        np.testing.assert_allclose(np.asarray(fn(q, kt, vt, allowed, kv_heads_first=True)), ref, atol=1e-5)


# ----------------------------------------------------------------------------- logical axes

@pytest.mark.parametrize("kind", ["lm", "lm_tied_bias", "value", "reward"])
def test_every_param_has_logical_axes(kind):
    if kind == "lm":
        model = tiny_lm("llama")
    elif kind == "lm_tied_bias":
        model = CausalLM(tiny_config("smollm2", attention_bias=True, mlp_bias=True), rngs=nnx.Rngs(0))
    elif kind == "value":
        model = ValueModel.from_lm(tiny_lm("qwen2"))
    else:
        model = RewardModel.from_lm(tiny_lm("mistral"))
    n = 0
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            axes = var.get_metadata().get("logical_axes")
            assert axes is not None, path
            assert len(axes) == var.get_value().ndim, (path, axes)
            n += 1
    assert n >= 11


# ----------------------------------------------------------------------------- heads

def test_value_and_reward_heads_by_hand():
    lm = tiny_lm("llama", seed=6)
    critic = ValueModel.from_lm(lm, rngs=nnx.Rngs(1))
    rm = RewardModel.from_lm(lm, rngs=nnx.Rngs(2))
    ids, mask = left_padded_prompts(61, lengths=(5, 3), width=5, seed=4)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    h = np.asarray(nnx.jit(lambda m, i, k: m.hidden_states(i, k))(lm, ids, mask), np.float64)
    w, c = np.asarray(critic.value_head.kernel.get_value())[:, 0], float(critic.value_head.bias.get_value()[0])
    np.testing.assert_allclose(np.asarray(_jit_forward(critic, ids, mask)), h @ w + c, atol=1e-5)
    w, c = np.asarray(rm.score_head.kernel.get_value())[:, 0], float(rm.score_head.bias.get_value()[0])
    scores = np.asarray(_jit_forward(rm, ids, mask))
    np.testing.assert_allclose(scores, h[:, -1] @ w + c, atol=1e-5)
    # right padding: the score is read at the last real token
    right_ids = jnp.concatenate([ids[1:, 2:], jnp.zeros((1, 2), jnp.int32)], axis=1)
    right_mask = jnp.array([[1, 1, 1, 0, 0]])
    np.testing.assert_allclose(np.asarray(_jit_forward(rm, right_ids, right_mask)), scores[1:], atol=1e-5)
    # the trunk is a copy: changing the critic does not touch the policy
    critic.model.embed.set_value(critic.model.embed.get_value() * 0)
    assert float(jnp.abs(lm.model.embed.get_value()).sum()) > 0


# ----------------------------------------------------------------------------- sharding

def test_sharded_model_matches_single_device():
    from jaxppo.parallel import make_mesh
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    ids, mask = left_padded_prompts(64, lengths=(6, 2, 5, 6), width=6, seed=5)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    single = tiny_lm("llama", seed=7, vocab_size=64)
    sharded = shard_model(tiny_lm("llama", seed=7, vocab_size=64), mesh)
    q = sharded.model.layers.q.get_value()
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (2, 8, 2, 8)
    logits = _jit_forward(sharded, ids, mask)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(_jit_forward(single, ids, mask)), atol=1e-5)
    # KV-cache generation runs on the sharded parameters and decodes the same tokens
    g_sh = generate(sharded, ids, mask, jax.random.key(0), max_new_tokens=4, temperature=0.0)
    g_1 = generate(single, ids, mask, jax.random.key(0), max_new_tokens=4, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(g_sh.tokens), np.asarray(g_1.tokens))


def test_indivisible_dimensions_are_replicated():
    from jaxppo.parallel import make_mesh
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    spec = jax.sharding.PartitionSpec
    assert fit_spec(spec("tensor", "fsdp"), (61, 32), mesh) == spec(None, "fsdp")
    assert fit_spec(spec(("data", "fsdp"), None), (6, 3), mesh) == spec(None, None)
    model = tiny_lm("llama", vocab_size=61, num_attention_heads=6, num_key_value_heads=3, head_dim=8)
    sh = named_shardings(model, mesh)
    assert sh["model"]["embed"].get_value().spec == spec(None, "fsdp")
    assert sh["model"]["layers"]["k"].get_value().spec == spec(None, "fsdp", None, None)
    shard_model(model, mesh)  # does not raise
    assert model.model.layers.gate.get_value().sharding.spec == spec(None, "fsdp", "tensor")


# ----------------------------------------------------------------------------- config

def test_config_round_trips_through_hf_dict():
    cfg = tiny_config("mistral", eos_token_id=(2, 5), rope_scaling=dict(rope_type="llama3", factor=8.0,
                      low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64))
    back = LMConfig.from_hf(cfg.to_hf(), initializer_range=cfg.initializer_range)
    assert back == cfg
    assert hash(back) == hash(cfg)


@pytest.mark.parametrize("kw,match", [
    (dict(architecture="gpt2"), r"architecture='gpt2' is not supported"),
    (dict(num_key_value_heads=3), "must be a multiple of num_key_value_heads=3"),
    (dict(head_dim=7), "head_dim=7 must be even"),
    (dict(rope_scaling=dict(rope_type="yarn", factor=2.0)), "rope_type 'yarn' is not supported"),
    (dict(rope_scaling=dict(rope_type="llama3", factor=2.0)), "needs field 'low_freq_factor'"),
    (dict(hidden_size=0), "hidden_size must be a positive integer"),
    (dict(compute_dtype="int8"), "compute_dtype='int8'"),
    (dict(scan_layers="yes"), "scan_layers must be true, false or 'auto', got 'yes'"),
    (dict(scan_layers=1), "scan_layers must be true, false or 'auto', got 1"),
])
def test_bad_config_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_config("llama", **kw)


def test_unsupported_hf_fields_are_named():
    base = tiny_config("llama").to_hf()
    with pytest.raises(ValueError, match="hidden_act='gelu' is not supported"):
        LMConfig.from_hf({**base, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="use_sliding_window=true"):
        LMConfig.from_hf({**tiny_config("qwen2").to_hf(), "use_sliding_window": True})
