"""``replay.group_size``: minibatches of whole prompt groups, each prompt through the trunk once.

The shared-prompt forward must give the row layout's logits, values and losses (and so the same gradients) on the
same rows; a run with it trains; bad data and settings get errors naming the key. The sampler's formulas are tested
in ``tests/replay/test_group_sampling.py``. Every run uses the tiny trainer config (``conftest.TINY``: 40 story
openings x 4 scored samples, so prompt groups of 4).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.config import ConfigError
from jaxppo.trainer.micro import strided_split
from jaxppo.trainer.ppo.forward import response_hidden, response_logits, response_logits_values, response_values
from jaxppo.trainer.ppo.hparams import step_hparams
from jaxppo.trainer.ppo.build import build_run
from jaxppo.trainer.ppo.windows import check_whole_groups, prompt_group_size
from jaxppo.trainer.micro import chunked_map, group_micro_order
from jaxppo.trainer.ppo.steps import make_phases

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

N = 4   # rows per prompt group in the trainer tests' data


def _groups_batch(state, n_groups=3, start=1):
    """The buffer rows of ``n_groups`` whole groups (slots ``start·N ..``), prepared, as a ``BufferItem``."""
    rows = np.arange(start * N, (start + n_groups) * N)
    return jax.tree.map(lambda x: x[rows], state.replay.storage)


@pytest.fixture(scope="module")
def gae_run(make_cfg_module):
    run = build_run(make_cfg_module("algorithm.adv_estimator=gae"), devices=jax.devices()[:1])
    return run, run.prepare(run.state)


@pytest.fixture(scope="module")
def make_cfg_module(tmp_path_factory, stories_model, scored_data):
    from jaxppo.config import load_config
    from tests.trainer.conftest import TINY

    def make(*overrides: str):
        out = tmp_path_factory.mktemp("run")
        return load_config(None, [f"model.path={stories_model}", f"data.path={scored_data}",
                                  f"trainer.output_dir={out}", *TINY, *overrides])
    return make


def test_buffer_groups_share_their_prompt_and_are_left_padded(gae_run):
    """The precondition of the shared layout on the real data: slots k·4 .. k·4+3 are one group with one prompt,
    and prompts of different lengths (left padding) occur, so the equality tests below cover padding."""
    run, state = gae_run
    d = jax.device_get(state.replay.storage.data)
    valid = int(np.sum(d.filter_w > 0))
    gid = d.group_id[:valid].reshape(-1, N)
    assert (gid == gid[:, :1]).all()
    pm = d.prompt_mask[:valid].reshape(-1, N, d.prompt_mask.shape[1])
    assert (pm == pm[:, :1]).all() and (d.prompt_ids[:valid].reshape(-1, N, pm.shape[-1]) ==
                                        d.prompt_ids[:valid].reshape(-1, N, pm.shape[-1])[:, :1]).all()
    assert len(np.unique(pm.sum(-1))) > 1 and (pm[..., 0] == 0).any()


@pytest.mark.parametrize("jit", [False, True])
def test_shared_prompt_forward_equals_the_row_layout(gae_run, jit):
    """Logits, values and the shared-trunk pair of 3 whole groups: the shared-prompt forward (each prompt once)
    equals the row forward (each row's concat(prompt, response)) at every response position, padded or not."""
    run, state = gae_run
    batch = _groups_batch(state).data
    agd, cgd = run.actor_gd, run.critic_gd
    wrap = jax.jit if jit else (lambda f, **_: f)

    lg = wrap(lambda p, b, n: response_logits(agd, p, b, group_size=n), static_argnums=2)
    vl = wrap(lambda p, b, n: response_values(cgd, p, b, group_size=n), static_argnums=2)
    m = np.asarray(batch.response_mask, bool)
    for n in (2, 4):     # a group of 4 read as pairs still shares one prompt per pair
        np.testing.assert_allclose(np.asarray(lg(state.actor, batch, n))[m], np.asarray(lg(state.actor, batch, 1))[m],
                                   rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(vl(state.critic, batch, n))[m],
                                   np.asarray(vl(state.critic, batch, 1))[m], rtol=2e-5, atol=2e-5)
    # the shared trunk: logits and values from one pass (a value head over the actor's hidden states)
    from flax import nnx

    from jaxppo.models.heads import ScalarHead
    hgd, hp = nnx.split(ScalarHead(run.policy(state.actor).config.hidden_size, rngs=nnx.Rngs(3)))
    one = response_logits_values(agd, state.actor, hgd, hp, batch, share_trunk=True, group_size=1)
    four = response_logits_values(agd, state.actor, hgd, hp, batch, share_trunk=True, group_size=N)
    for a, b in zip(four, one):
        np.testing.assert_allclose(np.asarray(a)[m], np.asarray(b)[m], rtol=2e-5, atol=2e-5)


def test_shared_hidden_states_cost_fewer_token_positions(gae_run):
    """The trunk's input in the shared layout is [G, P + n·R] instead of [G·n, P + R] (traced shapes)."""
    run, state = gae_run
    batch = _groups_batch(state).data
    b, p = batch.prompt_ids.shape
    r = batch.response_ids.shape[1]
    seen = []
    trunk = run.policy(state.actor).model
    orig = type(trunk.layers).__call__

    def spy(self, x, *a, **k):
        seen.append(x.shape)
        return orig(self, x, *a, **k)

    type(trunk.layers).__call__ = spy
    try:
        response_hidden(trunk, batch, group_size=N)
        response_hidden(trunk, batch, group_size=1)
    finally:
        type(trunk.layers).__call__ = orig
    assert seen[0][:2] == (b // N, p + N * r) and seen[1][:2] == (b, p + r)
    assert seen[0][0] * seen[0][1] < seen[1][0] * seen[1][1]


@pytest.mark.parametrize("share_trunk", [False, True])
def test_losses_and_gradients_equal_the_row_layout(gae_run, share_trunk):
    """Every phase's loss, metrics, priority and gradient on 3 whole groups: group_size=4 equals group_size=1
    (the same rows, weights and counts; only the layout of the trunk's input differs)."""
    run, state = gae_run
    batch = _groups_batch(state)
    hp1 = step_hparams(run.cfg)
    hp1 = dataclasses.replace(hp1, critic=dataclasses.replace(hp1.critic, share_trunk=share_trunk))
    hp4 = dataclasses.replace(hp1, replay=dataclasses.replace(hp1.replay, group_size=N))
    if share_trunk:
        from flax import nnx
        from jaxppo.models.heads import ScalarHead
        cgd, cp = nnx.split(ScalarHead(run.policy(state.actor).config.hidden_size, rngs=nnx.Rngs(3)))
        fields = {"actor": state.actor, "critic": cp}
    else:
        cgd, fields = run.critic_gd, {"actor": state.actor, "critic": state.critic}
    w = jnp.linspace(0.5, 1.0, batch.data.score.shape[0])
    for ph1, ph4 in zip(make_phases(hp1, run.actor_gd, cgd), make_phases(hp4, run.actor_gd, cgd)):
        params = tuple(fields[f] for f in ph1.fields)
        (l1, (a1, p1)), g1 = jax.jit(jax.value_and_grad(ph1.loss_fn, has_aux=True))(params, batch, w, None)
        (l4, (a4, p4)), g4 = jax.jit(jax.value_and_grad(ph4.loss_fn, has_aux=True))(params, batch, w, None)
        np.testing.assert_allclose(float(l4), float(l1), rtol=1e-5, atol=1e-6)
        for k in a1:
            np.testing.assert_allclose(float(a4[k]), float(a1[k]), rtol=1e-4, atol=1e-5, err_msg=k)
        if p1 is not None:
            np.testing.assert_allclose(np.asarray(p4), np.asarray(p1), rtol=1e-4, atol=1e-6)
        for x, y in zip(jax.tree.leaves(g4), jax.tree.leaves(g1)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("over", [("algorithm.adv_estimator=gae",),
                                  ("algorithm.adv_estimator=gae", "critic.share_trunk=true"),
                                  ("algorithm.adv_estimator=grpo", "replay.sampling=prioritized")])
def test_prepare_pass_in_whole_groups_equals_the_row_layout(make_cfg_module, over):
    """The prepare pass over the whole buffer (15 chunks of 8 rows) with replay.group_size=4 (rows reordered so
    every chunk holds whole groups, each prompt through the trunk once, outputs back in buffer order) gives the
    row layout's proximal log-probs, values, advantages, returns and stored priorities, slot by slot. With
    replay.group_size=1 on this data (every prompt group has 4 rows) the build picks the same prepare layout."""
    from tests.trainer.conftest import row_layout_prepare

    runs = [build_run(make_cfg_module(*over, f"replay.group_size={n}"), devices=jax.devices()[:1]) for n in (1, N)]
    rows, groups = (jax.device_get(r.state.replay.storage.data) for r in runs)
    assert rows.response_ids.shape[0] // runs[0].cfg.actor.ppo_micro_batch_size == 15
    for a, b in zip(jax.tree.leaves(rows), jax.tree.leaves(groups)):
        np.testing.assert_array_equal(a, b)                     # the same buffer
    row_prepare = row_layout_prepare(runs[0])
    flops = [p.lower(r.state).compile().cost_analysis()["flops"]
             for p, r in ((row_prepare, runs[0]), (runs[1].prepare, runs[1]), (runs[0].prepare, runs[0]))]
    assert flops[1] < 0.85 * flops[0], flops   # each prompt once: (16 + 4·16) / (4·32) of the trunk's positions
    assert flops[2] == flops[1], flops        # replay.group_size=1 on whole groups: the same layout
    one, four = jax.device_get(row_prepare(runs[0].state).replay), jax.device_get(runs[1].prepare(runs[1].state).replay)
    m = np.asarray(rows.response_mask, bool)
    p1, p4 = one.storage.prepared, four.storage.prepared
    assert (p1.values is None) == (p4.values is None) == ("grpo" in over[0])
    for f in ("prox_logp", "values", "advantages", "returns", "token_rewards"):
        a, b = getattr(p1, f), getattr(p4, f)
        if a is not None:
            np.testing.assert_allclose(np.asarray(b)[m], np.asarray(a)[m], rtol=1e-4, atol=1e-4, err_msg=f)
            assert not np.asarray(b)[~m].any(), f   # 0 outside the responses, padding slots included
    np.testing.assert_allclose(np.asarray(four.priorities), np.asarray(one.priorities), rtol=1e-3, atol=1e-5)
    assert np.asarray(one.priorities).std() > 0


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_map_with_groups_gives_each_piece_whole_groups_and_returns_row_order(jit):
    """24 rows in groups of 4 (row r in group r // 4), pieces of 8 (3 strided pieces): with group_size=4 every
    piece's rows k·4 .. k·4+3 are one group (fn reads each row's group as its block's first row), and the outputs
    come back in row order; without it, a piece's blocks of 4 mix groups."""
    rows = jnp.arange(24)

    def fn(piece):
        block_first = piece.reshape(-1, 4)[:, :1]
        return {"row": piece, "group_of_block": jnp.broadcast_to(block_first // 4, (piece.shape[0] // 4, 4)).reshape(-1)}

    f = jax.jit(chunked_map, static_argnums=(0, 2), static_argnames="group_size") if jit else chunked_map
    out = f(fn, rows, 8, group_size=4)
    np.testing.assert_array_equal(out["row"], np.arange(24))
    np.testing.assert_array_equal(out["group_of_block"], np.arange(24) // 4)
    plain = f(fn, rows, 8, group_size=1)
    np.testing.assert_array_equal(plain["row"], np.arange(24))
    assert not np.array_equal(plain["group_of_block"], np.arange(24) // 4)
    with pytest.raises(ValueError, match="whole groups"):
        chunked_map(fn, jnp.arange(16), 8, group_size=3)


def test_group_micro_order_keeps_whole_groups_in_every_micro_batch():
    for b, n, k in [(16, 4, 2), (24, 2, 3), (32, 4, 4), (8, 2, 1), (8, 1, 4)]:
        perm = group_micro_order(b, n, k)
        if n == 1 or k == 1:
            assert perm is None
            continue
        assert sorted(perm.tolist()) == list(range(b))
        micro = np.asarray(strided_split(jnp.asarray(perm), k))      # buffer rows (group order) per micro-batch
        for j in range(k):
            groups = micro[j].reshape(-1, n) // n
            assert (groups == groups[:, :1]).all()                                   # whole groups ...
            assert (micro[j].reshape(-1, n) % n == np.arange(n)).all()               # ... rows in order
            assert groups[:, 0].tolist() == list(range(j, b // n, k))                # groups j, j+k, ...
    with pytest.raises(ValueError, match="whole groups"):
        group_micro_order(12, 4, 2)


def test_grpo_run_with_whole_groups_trains_and_samples_whole_groups(make_cfg_module):
    """GRPO with replay.group_size=4 and 2 micro-batches: the step runs, the policy moves, every loss is finite and
    the priorities of exactly the drawn groups' rows change (whole groups: 4 per group, 16-row minibatch)."""
    run = build_run(make_cfg_module("algorithm.adv_estimator=grpo", "replay.group_size=4"), devices=jax.devices()[:1])
    assert step_hparams(run.cfg).replay.group_size == N
    state = run.prepare(run.state)
    a0 = jax.tree.map(lambda x: np.asarray(x).copy(), state.actor)
    for _ in range(3):
        prio0 = np.asarray(state.replay.sample_count).copy()
        state, met = run.step(state)
        met = {k: float(v) for k, v in jax.device_get(met).items()}
        assert met["train/nan_skipped"] == 0.0 and np.isfinite(met["actor/pg_loss"])
        drawn = np.flatnonzero(np.asarray(state.replay.sample_count) != prio0)
        groups = set((drawn // N).tolist())
        assert drawn.size and all(set(range(g * N, g * N + N)) <= set(drawn.tolist()) for g in groups), drawn
    moved = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(jax.tree.leaves(state.actor),
                                                                          jax.tree.leaves(a0)))
    assert moved > 1e-4


def test_config_errors_name_the_key(make_cfg_module):
    with pytest.raises(ConfigError, match="replay.group_size=3.*multiples"):
        step_hparams(make_cfg_module("replay.group_size=3"))
    with pytest.raises(ConfigError, match="reweight_method"):
        step_hparams(make_cfg_module("replay.group_size=4", "pf_ppo.enabled=true", "pf_ppo.reweight_method=pow"))
    with pytest.raises(ValueError, match="group_id .* has 4"):
        build_run(make_cfg_module("algorithm.adv_estimator=grpo", "replay.group_size=8",
                                  "actor.ppo_micro_batch_size=8"), devices=jax.devices()[:1])


def test_check_whole_groups_names_the_bad_group():
    ids = np.tile(np.arange(6)[None, :], (8, 1))
    train = {"group_id": np.repeat([5, 7], 4), "prompt_ids": ids, "prompt_mask": np.ones_like(ids)}
    check_whole_groups(train, 4)
    with pytest.raises(ValueError, match="2 of 2 prompt groups do not have 3"):
        check_whole_groups(train, 3)
    bad = dict(train, prompt_ids=ids.copy())
    bad["prompt_ids"][6, 2] = 99
    with pytest.raises(ValueError, match="prompt_ids differs within group_id 7"):
        check_whole_groups(bad, 4)
    bad = dict(train, prompt_mask=np.ones_like(ids))
    bad["prompt_mask"][1, 0] = 0
    with pytest.raises(ValueError, match="prompt_mask differs within group_id 5"):
        check_whole_groups(bad, 4)


@pytest.mark.slow
def test_one_and_eight_devices_agree_with_whole_groups(make_cfg_module):
    """GAE + critic with replay.group_size=4 on one device and on 8 (data 2 x fsdp 2 x tensor 2; 16-row micro-batch,
    4 rows = one whole group per batch shard): the same metrics for 3 steps."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    over = ("algorithm.adv_estimator=gae", "replay.group_size=4", "actor.ppo_micro_batch_size=16")
    out = []
    for mesh, devs in ((("mesh.data=1",), 1), (("mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"), 8)):
        run = build_run(make_cfg_module(*over, *mesh), devices=jax.devices()[:devs])
        state = run.prepare(run.state)
        ms = []
        for _ in range(3):
            state, m = run.step(state)
            ms.append({k: float(v) for k, v in jax.device_get(m).items()})
        out.append(ms)
    for a, b in zip(*out):
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=2e-3, abs=2e-5), (a["train/loss"], k)
    with pytest.raises(ConfigError, match="batch shards holds 2 rows"):
        build_run(make_cfg_module(*over, "actor.ppo_micro_batch_size=16", "mesh.data=8"), devices=jax.devices()[:8])


@pytest.mark.slow
def test_lora_with_dropout_and_whole_groups_trains(make_cfg_module):
    """Adapters (rank 4, dropout 0.3) over the frozen base with replay.group_size=4, GAE + critic: the adapter
    dropout keys reach the shared-prompt trunk, the steps are finite and the adapters move; with dropout 0 the
    shared layout's first step equals the row layout's (same sampled rows: the sampler differs only in
    group_size, so compare the losses of the phases on one batch of whole groups)."""
    run = build_run(make_cfg_module("algorithm.adv_estimator=gae", "replay.group_size=4", "model.lora.rank=4",
                                    "model.lora.dropout=0.3", "actor.optim.warmup_steps=0"),
                    devices=jax.devices()[:1])
    state = run.prepare(run.state)
    a0 = jax.tree.map(lambda x: np.asarray(x).copy(), state.actor)
    for _ in range(2):
        state, met = run.step(state)
        met = {k: float(v) for k, v in jax.device_get(met).items()}
        assert met["train/nan_skipped"] == 0.0 and np.isfinite(met["train/loss"])
    moved = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(jax.tree.leaves(state.actor),
                                                                          jax.tree.leaves(a0)))
    assert moved > 0.0
    hp4 = step_hparams(run.cfg)
    hp1 = dataclasses.replace(hp4, replay=dataclasses.replace(hp4.replay, group_size=1))
    batch = _groups_batch(state)
    w = jnp.ones((batch.data.score.shape[0],), jnp.float32)
    for ph1, ph4 in zip(make_phases(hp1, run.actor_gd, run.critic_gd, run.base),
                        make_phases(hp4, run.actor_gd, run.critic_gd, run.base)):
        params = tuple(getattr(state, f) for f in ph1.fields)
        l1 = jax.jit(ph1.loss_fn)(params, batch, w, None)[0]
        l4 = jax.jit(ph4.loss_fn)(params, batch, w, None)[0]
        np.testing.assert_allclose(float(l4), float(l1), rtol=1e-5, atol=1e-6)


def test_prompt_group_size_hand_cases():
    """Rows per prompt for the prepare pass's layout: replay.group_size when above 1; else the data's group size
    when every group has it with one prompt and each batch shard's part of a chunk holds whole groups; else 1."""
    ids = np.tile(np.arange(6)[None, :], (8, 1))
    ids[4:] += 10
    train = {"group_id": np.repeat([5, 7], 4), "prompt_ids": ids, "prompt_mask": np.ones_like(ids)}
    assert prompt_group_size(train, 1, chunk=8, shards=1) == 4
    assert prompt_group_size(train, 1, chunk=16, shards=2) == 4      # 8 rows a shard: 2 groups
    assert prompt_group_size(train, 1, chunk=8, shards=8) == 1       # 1 row a shard splits every group
    assert prompt_group_size(train, 1, chunk=6, shards=1) == 1       # 6 rows are not whole groups of 4
    assert prompt_group_size(train, 2, chunk=8, shards=1) == 2       # replay.group_size decides
    assert prompt_group_size(dict(train, group_id=np.array([5, 5, 5, 7, 7, 7, 7, 7])), 1, 8, 1) == 1   # 3 and 5 rows
    assert prompt_group_size(dict(train, group_id=np.arange(8)), 1, 8, 1) == 1                        # one row each
    bad = dict(train, prompt_ids=ids.copy())
    bad["prompt_ids"][6, 2] = 99                                     # two prompts in group 7
    assert prompt_group_size(bad, 1, 8, 1) == 1


@pytest.mark.parametrize("devices", [1, 2])
def test_prepare_runs_each_prompt_once_for_grouped_data(make_cfg_module, monkeypatch, devices):
    """replay.group_size=1 on data of 4 answers a prompt (1 device, and 2 devices where each shard's 4 rows of a
    chunk are one group): the build gives the prepare pass groups of 4, and its prepared buffer equals the row
    layout's (group_size=1) on the same state within float32 rounding: proximal log-probs, values, token rewards,
    advantages, returns and the sampling priorities."""
    import jaxppo.trainer.ppo.build as build_mod
    from jaxppo.optim import shardings_of
    from jaxppo.trainer.ppo.prepare import make_prepare_fn

    seen = []
    real = build_mod.make_prepare_fn

    def spy(*args, **kw):
        seen.append(kw["group_size"])
        return real(*args, **kw)

    monkeypatch.setattr(build_mod, "make_prepare_fn", spy)
    cfg = make_cfg_module("algorithm.adv_estimator=gae", f"mesh.fsdp={devices}")
    run = build_run(cfg, devices=jax.devices()[:devices])
    assert seen == [4]
    shardings = shardings_of(run.state)
    rows_fn = make_prepare_fn(run.actor_gd, run.critic_gd, chunk=8, hp=step_hparams(cfg), state_shardings=shardings,
                              base=run.parts.base, group_size=1)
    copy = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, run.state)
    grouped, rows = run.prepare(run.state), rows_fn(copy)
    a, b = grouped.replay.storage.prepared, rows.replay.storage.prepared
    for f in ("prox_logp", "values", "token_rewards", "advantages", "returns"):
        np.testing.assert_allclose(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), atol=2e-5, err_msg=f)
    np.testing.assert_allclose(np.asarray(grouped.replay.priorities), np.asarray(rows.replay.priorities),
                               rtol=1e-4, atol=1e-6)
    assert np.abs(np.asarray(a.prox_logp)).sum() > 0 and np.abs(np.asarray(a.values)).sum() > 0
