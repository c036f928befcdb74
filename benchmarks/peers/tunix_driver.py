"""Tunix's side of ``benchmarks/peers.py`` (run with ``benchmarks/peers/.venv-tunix/bin/python``; google-tunix
0.1.7 on jax 0.10.2).

The model is Tunix's ``models.llama3`` ``Llama3`` (``ModelConfig`` with SmolLM2-135M's dimensions and
``weight_tying=True``) built by ``llama3.params.create_model_from_safe_tensors`` from the shared weights. Its
``apply_rope`` is called without the config's ``rope_theta``, so Tunix always uses base 1e6; the comparison
uses 1e6 in every tool for that reason. Updates use Tunix's own trainers and loss functions:

- ``fwdbwd``: ``nnx.value_and_grad`` of the mean next-token cross-entropy of ``Llama3.__call__`` (jitted);
- ``dpo``: ``sft.dpo.DPOTrainer(ref_model=None)``'s jitted train step (``jit_train_and_eval_step``: donated
  optimizer) on a ``dpo_trainer.TrainExample`` that carries the precomputed reference log-probs (its own
  ``_prepare_inputs`` would run the reference model every step);
- ``dpo_hh``: the same step on the real-length pairs, prompts left padded and answers right padded to the batch's
  longest (Tunix's fixed-shape layout at its tightest: one compile for the batch).
- ``grpo``: a ``rl.trainer.Trainer`` (the learners' actor trainer) with ``algo_core.grpo_loss_fn``
  (``GRPOConfig(beta=0, epsilon=0.2, loss_agg_mode="token-mean")``);
- ``ppo``: the same actor trainer with ``ppo_policy_loss_fn`` and a critic trainer with ``ppo_value_loss_fn``
  (``clip_range_value=0.2``) on a critic = a second ``Llama3`` trunk + a scalar head (Tunix leaves the critic
  model to the user; this wrapper runs the trunk's layers and the head, as its value loss expects
  ``[B, T, 1]``);
- ``lora``: the DPO update on ``qwix.apply_lora_to_model`` (``LoraProvider`` rank 8, alpha 16, on q/k/v/o/gate/
  up/down; the trainer then optimizes only ``nnx.LoRAParam``).
- ``bfloat16``: Tunix's loader ``dtype=bfloat16`` (bfloat16 parameters: it has no separate compute dtype).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def build(task: str, dtype: str, spec: dict, b: dict, model_dir: Path):
    from importlib.metadata import version

    import flax
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from tunix.models.llama3 import model as llama
    from tunix.models.llama3 import params as llama_params
    from tunix.rl import common as rl_common

    versions = {"tunix": version("google-tunix"), "jax": jax.__version__, "flax": flax.__version__,
                "optax": optax.__version__, "qwix": version("qwix")}
    notes = ["params " + dtype + " (Tunix loader dtype)"]
    hp, s = spec["hparams"], spec["shapes"]
    pad_id, eos_id = spec["pad_id"], spec["pad_id"] - 1
    cfg = llama.ModelConfig(num_layers=spec["layers"], vocab_size=spec["vocab"], embed_dim=576, hidden_dim=1536,
                            num_heads=9, head_dim=64, num_kv_heads=3, rope_theta=int(spec["rope_theta"]),
                            norm_eps=1e-5, weight_tying=True)
    jdt = jnp.dtype(dtype)

    def load():
        return llama_params.create_model_from_safe_tensors(str(model_dir), cfg, mesh=None, dtype=jdt)

    def optimizer():
        return optax.chain(optax.clip_by_global_norm(hp["grad_clip"]),
                           optax.adamw(hp["lr"], b1=hp["adam_b1"], b2=hp["adam_b2"], eps=hp["adam_eps"],
                                       weight_decay=hp["weight_decay"]))

    model = load()

    if task == "fwdbwd":
        ids = jnp.asarray(b["fwd_ids"], jnp.int32)
        mask = jnp.ones_like(ids)
        pos = rl_common.build_positions_from_mask(mask)
        attn = rl_common.make_causal_attn_mask(mask)

        @nnx.jit
        def fwdbwd(model):
            def loss_fn(model):
                logits, _ = model(ids, pos, None, attn)
                lg = logits[:, :-1].astype(jnp.float32)
                tgt = jnp.take_along_axis(lg, ids[:, 1:, None], axis=-1)[..., 0]
                return jnp.mean(jax.nn.logsumexp(lg, axis=-1) - tgt)
            return nnx.value_and_grad(loss_fn)(model)

        loss = float(fwdbwd(model)[0])
        return loss, {}, lambda: jax.block_until_ready(fwdbwd(model)), versions, notes

    from tunix.sft import peft_trainer
    if task in ("dpo", "lora", "dpo_hh"):
        from tunix.sft.dpo import dpo_trainer
        if task == "lora":
            import qwix
            provider = qwix.LoraProvider(module_path=".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)",
                                         rank=hp["lora_rank"], alpha=hp["lora_alpha"])
            model = qwix.apply_lora_to_model(model, provider, **model.get_model_input(), rngs=nnx.Rngs(0))
            notes.append("qwix.LoraProvider rank 8 on q/k/v/o/gate/up/down; the trainer optimizes nnx.LoRAParam")
        trainer = dpo_trainer.DPOTrainer(model, None, optimizer(), dpo_trainer.DPOTrainingConfig(
            eval_every_n_steps=10 ** 9, max_steps=10 ** 6, beta=hp["dpo_beta"], label_smoothing=0.0))
        train_step, _ = trainer.jit_train_and_eval_step()
        if task == "dpo_hh":    # prompts left padded, answers right padded, to the batch's longest (not the caps)
            import numpy as np
            rows = common.ragged_rows(b)
            P, R = max(len(p) for p, _ in rows), max(len(a) for _, a in rows)
            ids_np = np.full((len(rows), P + R), spec["pad_id"], np.int32)
            mask_np = np.zeros((len(rows), P + R), np.int32)
            for i, (p, a) in enumerate(rows):
                ids_np[i, P - len(p):P], ids_np[i, P:P + len(a)] = p, a
                mask_np[i, P - len(p):P + len(a)] = 1
            ids, mask = jnp.asarray(ids_np), jnp.asarray(mask_np)
            ref_c, ref_r = jnp.asarray(b["hh_ref_chosen"]), jnp.asarray(b["hh_ref_rejected"])
            notes.append(f"prompts left / answers right padded to the batch's longest: {ids_np.shape}")
        else:
            P, R = s["dpo_prompt"], s["dpo_response"]
            prompt = jnp.asarray(b["dpo_prompt"], jnp.int32)
            ids = jnp.concatenate([jnp.concatenate([prompt, jnp.asarray(b["dpo_chosen"], jnp.int32)], 1),
                                   jnp.concatenate([prompt, jnp.asarray(b["dpo_rejected"], jnp.int32)], 1)], 0)
            mask = jnp.ones_like(ids)
            ref_c, ref_r = jnp.asarray(b["dpo_ref_chosen"]), jnp.asarray(b["dpo_ref_rejected"])
        ex = dpo_trainer.TrainExample(
            input_ids=ids, positions=rl_common.build_positions_from_mask(mask),
            attention_mask=rl_common.make_causal_attn_mask(mask), ref_chosen_logps=ref_c,
            ref_rejected_logps=ref_r, completion_mask=mask[:, P:].astype(jnp.float32), logits_to_keep=R)

        def update():
            out = train_step(ex)
            return jax.block_until_ready(out[0])

        loss = float(update())
        return loss, {}, update, versions, notes + ["update = DPOTrainer.jit_train_and_eval_step train step"]

    from tunix.rl import algo_core
    from tunix.rl import trainer as rl_trainer
    from tunix.rl.ppo import ppo_learner
    prompt = jnp.asarray(b["rl_prompt"], jnp.int32)
    resp = jnp.asarray(b["rl_response"], jnp.int32)
    ones_p, ones_r = jnp.ones_like(prompt), jnp.ones(resp.shape, jnp.float32)
    tcfg = lambda: peft_trainer.TrainingConfig(eval_every_n_steps=10 ** 9, max_steps=10 ** 6)
    actor = rl_trainer.Trainer(model, optimizer(), tcfg(), dict)
    if task == "grpo":
        from tunix.rl.grpo import grpo_learner
        algo = grpo_learner.GRPOConfig(num_generations=s["group"], beta=0.0, epsilon=hp["clip_eps"],
                                       loss_agg_mode="token-mean")
        algo.temperature = 1.0
        actor.with_loss_fn(lambda model, train_example: algo_core.grpo_loss_fn(
            model, train_example, algo_config=algo, pad_id=pad_id, eos_id=eos_id), has_aux=True)
        ex = grpo_learner.TrainExample(prompt_ids=prompt, prompt_mask=ones_p, completion_ids=resp,
                                       completion_mask=ones_r, advantages=jnp.asarray(b["grpo_adv"]),
                                       ref_per_token_logps=None, old_per_token_logps=jnp.asarray(b["rl_old_logp"]))
    else:
        algo = ppo_learner.PPOConfig(beta=0.0, epsilon=hp["clip_eps"], epsilon_low=hp["clip_eps"],
                                     epsilon_high=hp["clip_eps"], entropy_coef=0.0,
                                     clip_range_value=hp["value_clip"])
        actor.with_loss_fn(lambda model, train_example: algo_core.ppo_policy_loss_fn(
            model, train_example, algo_config=algo, pad_id=pad_id, eos_id=eos_id), has_aux=True)
        ex = ppo_learner.TrainExample(prompt_ids=prompt, prompt_mask=ones_p, completion_ids=resp,
                                      completion_mask=ones_r, advantages=jnp.asarray(b["ppo_adv"]),
                                      ref_per_token_logps=None, old_per_token_logps=jnp.asarray(b["rl_old_logp"]),
                                      returns=jnp.asarray(b["ppo_returns"]), old_values=jnp.asarray(b["ppo_values"]))
    actor.with_gen_model_input_fn(lambda x: {"train_example": x})
    actor_step, _ = actor.jit_train_and_eval_step()
    steps = [actor_step]
    if task == "ppo":
        critic = rl_trainer.Trainer(_critic(load(), b, jdt), optimizer(), tcfg(), dict)
        critic.with_loss_fn(lambda model, train_example: algo_core.ppo_value_loss_fn(
            model, train_example, clip_range_value=hp["value_clip"], pad_id=pad_id, eos_id=eos_id), has_aux=True)
        critic.with_gen_model_input_fn(lambda x: {"train_example": x})
        steps.append(critic.jit_train_and_eval_step()[0])
        notes.append("critic = Llama3 trunk + scalar head (wrapper here)")

    def update():
        return [float(jax.block_until_ready(st(ex)[0])) for st in steps]

    losses = update()
    parts = {"policy_loss": losses[0], **({"value_loss": losses[1]} if task == "ppo" else {})}
    return sum(losses), parts, update, versions, notes + [f"update = rl.trainer.Trainer train step(s), {task}"]


def _critic(lm, b, dtype):
    """A value model for Tunix's PPO value loss: ``lm``'s embedding and layers, its final norm and a scalar head
    with the shared initial head weights; ``__call__`` has ``Llama3``'s signature and returns ``([B, T, 1], None)``."""
    import jax.numpy as jnp
    from flax import nnx

    class Critic(nnx.Module):
        def __init__(self, lm):
            self.embedder, self.layers, self.final_norm = lm.embedder, lm.layers, lm.final_norm
            self.kernel = nnx.Param(jnp.asarray(b["value_head_kernel"], jnp.float32))
            self.bias = nnx.Param(jnp.asarray(b["value_head_bias"], jnp.float32))

        def __call__(self, input_tokens, positions, cache, attention_mask, segment_ids=None):
            x = self.embedder.encode(input_tokens)
            for layer in self.layers:
                _, x = layer(x, positions, None, attention_mask)
            x = self.final_norm(x).astype(jnp.float32)
            return x @ self.kernel[...] + self.bias[...], None

    return Critic(lm)


if __name__ == "__main__":
    common.run_driver("tunix", build)
