"""jaxppo's side of ``benchmarks/peers.py`` (run with this repository's python, ``PYTHONPATH`` = the repo root).

Every import of jaxppo internals used by the peer comparison is in THIS file (one place to update when the
trainer modules move). Besides the driver tasks of ``common.py`` it writes the shared weights:
``python jaxppo_driver.py --export WORK --layers N [--rope-theta T]`` builds a random SmolLM2-135M-shaped
``CausalLM`` (seed 0) and saves it as a Hugging Face folder ``WORK/model`` that every tool loads.

What each task runs (the jaxppo code paths a training run takes):

- ``fwdbwd``: ``value_and_grad`` of the mean next-token cross-entropy, LM head on the ``T-1`` predicting
  positions (as ``benchmarks/model.py``);
- ``dpo``: ``trainer.dpo_step.make_dpo_step`` (the DPO trainer's jitted, donated update; sigmoid loss,
  reference log-probs from the batch);
- ``dpo_hh``: the same step on the real-length pairs with their packed rows (``data.packing``:
  ``trainer.dpo.steps.plan_pairs``, each pair's prompt once; planned on the host before the timing, as the trainer
  plans a batch while building it);
- ``grpo`` / ``ppo``: the PPO trainer's update of one minibatch, ``steps.make_phases`` + ``make_update`` +
  ``run_epochs`` (actor phase; ``ppo`` adds the critic phase of a separate ``ValueModel``), jitted with the
  parameters and optimizer states donated; ``replay.group_size = 4`` as a GRPO run on this data sets it (the rows
  of a group share their prompt, which actor and critic run through the trunk once: ``trainer.ppo.forward``).
  Not timed: the replay sample and priority write-back around it in ``make_train_step`` (gathers of 8 rows), and
  the prepare pass (GAE), whose outputs come in the batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def _jax_versions() -> dict:
    import flax
    import jax
    import optax
    return {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__}


def export(work: str, layers: int, rope_theta: float) -> Path:
    """Random SmolLM2-135M-shaped weights (``layers`` layers, seed 0) saved to ``work/model`` (HF folder)."""
    from flax import nnx

    from jaxppo.hf.save import save_pretrained
    from jaxppo.models import CausalLM, LMConfig
    cfg = LMConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=rope_theta,
                   rms_norm_eps=1e-5, max_position_embeddings=8192)
    return save_pretrained(CausalLM(cfg, rngs=nnx.Rngs(0)), Path(work) / "model")


def _optimizer(hp: dict):
    from types import SimpleNamespace

    from jaxppo.optim import make_optimizer
    o = SimpleNamespace(lr=hp["lr"], warmup_steps=0, schedule="constant", min_lr_ratio=1.0,
                        betas=(hp["adam_b1"], hp["adam_b2"]), eps=hp["adam_eps"], weight_decay=hp["weight_decay"],
                        grad_clip=hp["grad_clip"])
    return make_optimizer(o, 1)


def _load(model_dir: Path, dtype: str):
    import jax.numpy as jnp

    from jaxppo.hf.load import load_pretrained
    return load_pretrained(model_dir, dtype=jnp.float32, compute_dtype=jnp.dtype(dtype))


def build(task: str, dtype: str, spec: dict, b: dict, model_dir: Path):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    hp = spec["hparams"]
    model = _load(model_dir, dtype)
    notes = [f"params float32, compute {dtype}" + (" (model.compute_dtype)" if dtype != "float32" else "")]
    base = None
    if task == "lora":   # the DPO update with rank-r adapters on q/k/v/o/gate/up/down over the frozen base
        from jaxppo.models.adapters import attach_lora, split_frozen
        from jaxppo.models.lora import LoraSpec
        model = attach_lora(model, LoraSpec(rank=hp["lora_rank"], alpha=hp["lora_alpha"]), seed=0)
        notes.append(f"LoRA rank {hp['lora_rank']} alpha {hp['lora_alpha']} on q,k,v,o,gate,up,down "
                     "(jaxppo.models.lora; the base is a frozen, non-donated argument of the step)")
    versions = _jax_versions()

    if task == "fwdbwd":
        graphdef, params = nnx.split(model)

        def loss_fn(params, ids):
            m = nnx.merge(graphdef, params)
            logits = m.logits_from_hidden(m.hidden_states(ids, jnp.ones_like(ids))[:, :-1])
            tgt = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
            return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)

        step = jax.jit(jax.value_and_grad(loss_fn))
        ids = jnp.asarray(b["fwd_ids"], jnp.int32)
        loss = float(step(params, ids)[0])
        return loss, {}, lambda: jax.block_until_ready(step(params, ids)), versions, notes

    if task in ("dpo", "lora", "dpo_hh"):
        from jaxppo.trainer.dpo.steps import DPOHParams, DPOState, make_dpo_step, plan_pairs
        from jaxppo.optim import split_params
        if task == "lora":
            from jaxppo.models.adapters import split_frozen
            graphdef, params, base = split_frozen(model)
        else:
            graphdef, params = split_params(model)
        tx = _optimizer(hp)
        pairs = spec["shapes"]["hh_pairs" if task == "dpo_hh" else "dpo_pairs"]
        dhp = DPOHParams(beta=hp["dpo_beta"], loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=0.0,
                         micro_batch_size=pairs)
        step = make_dpo_step(graphdef, tx, lambda s: jnp.float32(hp["lr"]), dhp, base=base)
        z = lambda: jnp.zeros((), jnp.int32)  # distinct buffers: the state is donated
        state = DPOState(step=z(), actor=params, actor_opt=tx.init(params), lr_scale=jnp.ones((), jnp.float32),
                         nan_total=z(), nan_streak=z(), data_cursor=z())
        ones = lambda x: jnp.ones(x.shape, jnp.int32)
        batch = {"prompt_ids": jnp.asarray(b["dpo_prompt"], jnp.int32), "chosen_ids": jnp.asarray(b["dpo_chosen"], jnp.int32),
                 "rejected_ids": jnp.asarray(b["dpo_rejected"], jnp.int32),
                 "ref_chosen": jnp.asarray(b["dpo_ref_chosen"]), "ref_rejected": jnp.asarray(b["dpo_ref_rejected"])}
        batch.update(prompt_mask=ones(batch["prompt_ids"]), chosen_mask=ones(batch["chosen_ids"]),
                     rejected_mask=ones(batch["rejected_ids"]))
        if task == "dpo_hh":   # the real-length pairs, packed (data.packing)
            host = {k[3:]: b[k] for k in b if k.startswith("hh_") and not k.startswith("hh_ref_")}
            batch = {**{k: jnp.asarray(v, jnp.int32) for k, v in host.items()},
                     "ref_chosen": jnp.asarray(b["hh_ref_chosen"]), "ref_rejected": jnp.asarray(b["hh_ref_rejected"]),
                     "packed": jax.tree.map(jnp.asarray, plan_pairs(host, pairs))}
            notes.append(f"packed rows {tuple(batch['packed'].ids.shape)} (data.packing: plan_pairs, each prompt once)")
        holder = {"state": state}

        def update():
            holder["state"], m = step(holder["state"], batch)
            jax.block_until_ready(m["loss"])
            return m

        m = update()  # the loss is of the weights before this first update
        parts = {"logp_chosen_mean": float(m["logps/chosen"]) if "logps/chosen" in m else None}
        return float(m["loss"]), parts, update, versions, notes + ["update = trainer.dpo_step.make_dpo_step"]

    if task in ("grpo", "ppo"):
        return _rl_update(task, hp, spec, b, model, versions, notes)
    raise ValueError(f"unknown task {task!r}")


def _rl_update(task, hp, spec, b, model, versions, notes):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxppo import ops
    from jaxppo.trainer.ppo.buffer_types import BufferItem, Prepared, Trajectories
    from jaxppo.trainer.ppo.hparams import (
        PFHP,
        ActorHP,
        AdvantageHP,
        CriticHP,
        ImportanceHP,
        ReplayHP,
        RolloutCorrHP,
        StepHP,
    )
    from jaxppo.optim import split_params
    from jaxppo.trainer.ppo.state import make_critic
    from jaxppo.trainer.ppo.steps import make_phases, make_update, run_epochs

    s = spec["shapes"]
    B, R = s["rl_batch"], s["rl_response"]
    critic = task == "ppo"
    group_size = s["group"]      # replay.group_size of a GRPO run on this data (module docstring)
    # dual clip off (clip_c huge): neither TRL nor Tunix (by default) has it
    actor_hp = ActorHP(clip_low=hp["clip_eps"], clip_high=hp["clip_eps"], clip_c=1e9, agg="token-mean",
                       entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl",
                       kl_penalty="kl")
    critic_hp = CriticHP(cliprange_value=hp["value_clip"], agg="token-mean", vf_coef=1.0, gamma=hp["gamma"],
                         priority_agg="mean") if critic else None
    shp = StepHP(actor=actor_hp, critic=critic_hp,
                 advantage=AdvantageHP(estimator="gae" if critic else "grpo",
                                       params=ops.AdvantageHParams(gamma=hp["gamma"], lam=hp["lam"]),
                                       norm_adv=False, use_kl_in_reward=False, kl_penalty="kl"),
                 importance=ImportanceHP(), rollout_corr=RolloutCorrHP(),
                 replay=ReplayHP(prioritized=False, priority="abs_advantage", priority_agg="mean", beta0=0.0,
                                 beta_steps=1, group_size=group_size),
                 pf=PFHP(), mini_batch=B, micro_batch=B, actor_epochs=1, critic_epochs=1)
    m = np.ones((B, R), np.int32)
    adv = b["ppo_adv"] if critic else np.repeat(b["grpo_adv"][:, None], R, 1)
    data = Trajectories(prompt_ids=b["rl_prompt"].astype(np.int32), prompt_mask=np.ones_like(b["rl_prompt"], np.int32),
                        response_ids=b["rl_response"].astype(np.int32), response_mask=m,
                        behaviour_logprobs=b["rl_old_logp"], score=b["rl_scores"],
                        group_id=np.arange(B, dtype=np.int32) // s["group"], row=np.arange(B, dtype=np.int32),
                        ref_logp=b["rl_old_logp"], filter_w=np.ones(B, np.float32))
    prep = Prepared(prox_logp=b["rl_old_logp"], token_rewards=b["ppo_token_rewards"], advantages=adv.astype(np.float32),
                    returns=b["ppo_returns"], values=b["ppo_values"] if critic else None)
    batch = jax.tree.map(jnp.asarray, BufferItem(data=data, prepared=prep))
    actor_gd, actor_p = split_params(model)
    tx = _optimizer(hp)
    fields = {"actor": actor_p, "actor_opt": tx.init(actor_p)}
    critic_gd = None
    if critic:
        cm = make_critic(model, share_trunk=False, seed=1)
        cm.value_head.kernel[...] = jnp.asarray(b["value_head_kernel"]).reshape(cm.value_head.kernel[...].shape)
        cm.value_head.bias[...] = jnp.asarray(b["value_head_bias"]).reshape(cm.value_head.bias[...].shape)
        critic_gd, critic_p = split_params(cm)
        fields.update(critic=critic_p, critic_opt=tx.init(critic_p))
    phases = [(ph, make_update(ph.loss_fn, tuple(tx for _ in ph.fields), 1)) for ph in make_phases(shp, actor_gd,
                                                                                                    critic_gd)]
    w = jnp.ones((B,), jnp.float32)

    def step(fields, batch):
        out, losses = dict(fields), {}
        for ph, upd in phases:
            params = tuple(fields[f] for f in ph.fields)
            opts = tuple(fields[f + "_opt"] for f in ph.fields)
            p, o, aux, _, _, _ = run_epochs(upd, ph.epochs, params, opts, batch, w)
            for f, pi, oi in zip(ph.fields, p, o):
                out[f], out[f + "_opt"] = pi, oi
            losses[ph.fields[0]] = aux["_loss"]
        return out, losses

    jstep = jax.jit(step, donate_argnums=0)
    holder = {"fields": fields}

    def update():
        holder["fields"], losses = jstep(holder["fields"], batch)
        return jax.block_until_ready(losses)

    losses = {k: float(v) for k, v in update().items()}
    loss = losses["actor"] + losses.get("critic", 0.0)
    parts = {"policy_loss": losses["actor"], **({"value_loss": losses["critic"]} if critic else {})}
    return loss, parts, update, versions, notes + [("update = trainer.steps make_phases/make_update/run_epochs, "
                                                    "jitted with donation (no replay sample); replay.group_size="
                                                    f"{group_size}: each group's prompt through the trunk once")]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--export":
        import argparse
        ap = argparse.ArgumentParser()
        ap.add_argument("--export", required=True)
        ap.add_argument("--layers", type=int, default=30)
        ap.add_argument("--rope-theta", type=float, default=1e6)
        a = ap.parse_args(argv)
        print(export(a.export, a.layers, a.rope_theta))
        return
    common.run_driver("jaxppo", build, argv)


if __name__ == "__main__":
    main()
