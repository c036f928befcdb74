"""TRL's side of ``benchmarks/peers.py`` (run with ``benchmarks/peers/.venv-trl/bin/python``; torch CPU).

The model is transformers' ``LlamaForCausalLM`` loaded from the shared Hugging Face folder. The losses are
TRL's own: a ``DPOTrainer`` / ``GRPOTrainer`` is built on the model (a two-row dummy dataset and a word-level
tokenizer whose word ``t<i>`` is token ``i``, both only to satisfy the constructors) and the timed update is
``trainer.compute_loss(model, inputs)`` -> ``backward`` -> ``clip_grad_norm_`` -> ``trainer.create_optimizer()``'s
AdamW ``step`` -> ``zero_grad``, i.e. the body of ``Trainer.training_step`` without the data loader.

- ``dpo``: ``DPOConfig(precompute_ref_log_probs=True)``: no reference model kept, the reference log-probs come
  in the inputs (``ref_chosen_logps`` / ``ref_rejected_logps``); TRL's fused LM head scores only the response
  positions.
- ``grpo``: ``GRPOConfig(beta=0, loss_type="bnpo")`` (token-mean over the batch, jaxppo's ``token-mean``),
  ``epsilon=0.2``; advantages and ``old_per_token_logps`` in the inputs.
- ``dpo_hh``: the same update on the real-length pairs in the layout of TRL's preference collator: each row
  ``prompt + answer`` (chosen rows, then rejected), right padded to the batch's longest row, ``completion_mask`` on
  the answer tokens (exactly what ``DataCollatorForPreference`` builds; TRL 1.16 turns ``padding_free=True`` off
  with a warning and pads).
- ``ppo``: TRL 1.16 ships no PPO trainer (no value-model update step): reported as unsupported.
- ``lora``: ``peft`` rank-8 adapters on the DPO update, when ``peft`` is installed in the venv.
- ``bfloat16``: float32 parameters under ``torch.autocast("cpu", bfloat16)`` (what ``bf16=True`` does).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=f"t{vocab - 1}", eos_token=f"t{vocab - 2}",
                                   unk_token="t0")


def _common_args(hp: dict, dtype: str, out_dir: str, batch: int) -> dict:
    return dict(output_dir=out_dir, report_to="none", use_cpu=True, learning_rate=hp["lr"], adam_beta1=hp["adam_b1"],
                adam_beta2=hp["adam_b2"], adam_epsilon=hp["adam_eps"], weight_decay=hp["weight_decay"],
                max_grad_norm=hp["grad_clip"], per_device_train_batch_size=batch, bf16=dtype == "bfloat16",
                lr_scheduler_type="constant", logging_steps=1000, save_strategy="no", seed=0)


def build(task: str, dtype: str, spec: dict, b: dict, model_dir: Path):
    import numpy as np
    import torch
    import transformers
    import trl

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    notes = [f"torch threads {torch.get_num_threads()}",
             "params float32" + (", torch.autocast(cpu, bfloat16)" if dtype == "bfloat16" else "")]
    if task == "ppo":
        raise common.Unsupported(f"trl {trl.__version__} has no PPO trainer (no value-model update step)")
    hp, s = spec["hparams"], spec["shapes"]
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bfloat16" else contextlib.nullcontext
    T = lambda x: torch.from_numpy(np.asarray(x))

    if task == "fwdbwd":
        ids = T(b["fwd_ids"]).long()

        def fwdbwd():
            model.zero_grad(set_to_none=True)
            with amp():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            return loss

        loss = float(fwdbwd())
        return loss, {}, fwdbwd, versions, notes + ["transformers LlamaForCausalLM(labels=ids).loss, backward"]

    from datasets import Dataset
    tmp = tempfile.mkdtemp(prefix="trl-")
    tok = _tokenizer(spec["vocab"])
    if task in ("dpo", "lora", "dpo_hh"):
        peft_config = None
        if task == "lora":
            try:
                import peft
            except ImportError:
                raise common.Unsupported("peft is not installed in the TRL venv") from None
            versions["peft"] = peft.__version__
            peft_config = peft.LoraConfig(r=hp["lora_rank"], lora_alpha=hp["lora_alpha"], lora_dropout=0.0,
                                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"], task_type="CAUSAL_LM")
        ds = Dataset.from_dict({"prompt": ["t1 t2", "t3 t4"], "chosen": [" t5", " t6"], "rejected": [" t7", " t8"]})
        n = s["hh_pairs" if task == "dpo_hh" else "dpo_pairs"]
        args = trl.DPOConfig(**_common_args(hp, dtype, tmp, n), beta=hp["dpo_beta"], loss_type=["sigmoid"],
                             precompute_ref_log_probs=True, max_length=None)
        trainer = trl.DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                                 peft_config=peft_config)
        if task == "dpo_hh":    # ragged rows, right padded to the longest (TRL's preference collator layout)
            rows = common.ragged_rows(b)
            width = max(len(p) + len(a) for p, a in rows)
            ids = torch.full((2 * n, width), spec["pad_id"], dtype=torch.long)
            am = torch.zeros(2 * n, width, dtype=torch.long)
            cm = torch.zeros(2 * n, width, dtype=torch.long)
            for i, (p, a) in enumerate(rows):
                ids[i, :len(p) + len(a)] = torch.tensor(p + a)
                am[i, :len(p) + len(a)] = 1
                cm[i, len(p):len(p) + len(a)] = 1
            inputs = {"input_ids": ids, "attention_mask": am, "completion_mask": cm,
                      "ref_chosen_logps": T(b["hh_ref_chosen"]), "ref_rejected_logps": T(b["hh_ref_rejected"])}
            notes.append(f"rows right padded to the batch's longest: {tuple(ids.shape)}")
        else:
            P, R = s["dpo_prompt"], s["dpo_response"]
            prompt = T(b["dpo_prompt"]).long()
            ids = torch.cat([torch.cat([prompt, T(b["dpo_chosen"]).long()], 1),
                             torch.cat([prompt, T(b["dpo_rejected"]).long()], 1)], 0)
            cm = torch.cat([torch.zeros(2 * n, P, dtype=torch.long), torch.ones(2 * n, R, dtype=torch.long)], 1)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": cm,
                      "ref_chosen_logps": T(b["dpo_ref_chosen"]), "ref_rejected_logps": T(b["dpo_ref_rejected"])}
        notes.append("update = DPOTrainer.compute_loss + backward + clip + AdamW step (precompute_ref_log_probs)")
    else:  # grpo
        ds = Dataset.from_dict({"prompt": ["t1 t2"] * s["rl_batch"]})
        args = trl.GRPOConfig(**_common_args(hp, dtype, tmp, s["rl_batch"]), beta=0.0, loss_type="bnpo",
                              epsilon=hp["clip_eps"], num_generations=s["group"],
                              max_completion_length=s["rl_response"])
        trainer = trl.GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                                  args=args, train_dataset=ds, processing_class=tok)
        ones = lambda x: torch.ones_like(x)
        pi, ci = T(b["rl_prompt"]).long(), T(b["rl_response"]).long()
        inputs = {"prompt_ids": pi, "prompt_mask": ones(pi), "completion_ids": ci, "completion_mask": ones(ci),
                  "advantages": T(b["grpo_adv"]), "old_per_token_logps": T(b["rl_old_logp"])}
        notes.append("update = GRPOTrainer.compute_loss + backward + clip + AdamW step")
    if not hasattr(trainer, "current_gradient_accumulation_steps"):
        trainer.current_gradient_accumulation_steps = 1
    tmodel = trainer.model
    tmodel.train()
    opt = trainer.create_optimizer()
    params = [p for p in tmodel.parameters() if p.requires_grad]

    def update():
        with amp():
            loss = trainer.compute_loss(tmodel, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, hp["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    loss = float(update())
    return loss, {}, update, versions, notes


if __name__ == "__main__":
    common.run_driver("trl", build)
