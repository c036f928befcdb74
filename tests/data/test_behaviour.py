import json

import jax
import numpy as np
import pytest

from jaxppo.config.schema import DataConfig
from jaxppo.data.behaviour import (cache_key, compute_behaviour_logprobs, fill_behaviour_logprobs,
                                   load_scored_arrays, model_fingerprint, response_logprobs)
from jaxppo.data.tokenize import left_pad, right_pad


@pytest.fixture(scope="module")
def stories(shared_dir):
    from jaxppo.hf import load_pretrained

    path = str(shared_dir / "models" / "stories260K")
    return path, load_pretrained(path)


def _arrays(prompts, responses, P=6, R=4):
    pi, pm = left_pad(prompts, P, 0)
    ri, rm = right_pad(responses, R, 0)
    return {"prompt_ids": pi, "prompt_mask": pm, "response_ids": ri, "response_mask": rm,
            "behaviour_logprobs": np.zeros((len(prompts), R), np.float32),
            "has_behaviour": np.zeros(len(prompts), bool)}


PROMPTS = [[1, 403, 407, 261, 378], [1, 403], [1, 11, 12, 13, 14, 15]]
RESPONSES = [[11, 300, 2], [407, 261, 378, 11], [5]]


def _torch_reference(hf, prompt, response):
    """Log-probs of ``response`` after ``prompt`` from transformers' own Llama (no padding at all)."""
    import torch

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
    return np.array([logp[len(prompt) + t - 1, tok].item() for t, tok in enumerate(response)])


def test_matches_transformers_without_padding(stories):
    import torch
    from transformers import AutoModelForCausalLM

    path, model = stories
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    a = _arrays(PROMPTS, RESPONSES)
    lp = compute_behaviour_logprobs(model, a, batch_size=2)  # 2 batches, the last one padded
    assert lp.shape == (3, 4) and lp.dtype == np.float32
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        np.testing.assert_allclose(lp[i, :len(r)], _torch_reference(hf, p, r), atol=2e-4, rtol=1e-4)
        assert (lp[i, len(r):] == 0).all()


def test_jit_and_eager_agree(stories):
    _, model = stories
    a = _arrays(PROMPTS, RESPONSES)
    args = [a[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
    eager = np.asarray(response_logprobs(model, *args))
    with jax.disable_jit():
        eager_nojit = np.asarray(response_logprobs(model, *args))
    jitted = compute_behaviour_logprobs(model, a, batch_size=3)
    np.testing.assert_allclose(jitted, eager, atol=1e-5)
    np.testing.assert_allclose(eager_nojit, eager, atol=1e-5)


def test_cached_equals_fresh_and_key_tracks_the_data(stories, tmp_path):
    path, model = stories
    a = _arrays(PROMPTS, RESPONSES)
    loads = []

    def loader(p):
        loads.append(p)
        return model

    first = fill_behaviour_logprobs(a, model_path=path, load_model=loader, cache_dir=tmp_path, batch_size=2)
    assert len(loads) == 1 and len(list(tmp_path.glob("behaviour-*.safetensors"))) == 1

    def no_model(p):
        raise AssertionError("the cache should have been used")

    second = fill_behaviour_logprobs(a, model_path=path, load_model=no_model, cache_dir=tmp_path, batch_size=2)
    fresh = compute_behaviour_logprobs(model, a, batch_size=3)
    np.testing.assert_array_equal(second["behaviour_logprobs"], first["behaviour_logprobs"])
    np.testing.assert_allclose(second["behaviour_logprobs"], fresh, atol=1e-5)
    # the cache file holds plain float32 tensors (no pickle)
    from safetensors.numpy import load_file
    (f,) = tmp_path.glob("behaviour-*.safetensors")
    assert load_file(str(f))["behaviour_logprobs"].dtype == np.float32

    b = _arrays(PROMPTS, [RESPONSES[0], RESPONSES[1], [6]])  # one token changed -> new key -> recompute
    assert cache_key(model_fingerprint(path), b) != cache_key(model_fingerprint(path), a)
    fill_behaviour_logprobs(b, model_path=path, load_model=loader, cache_dir=tmp_path)
    assert len(loads) == 2


def test_logged_logprobs_are_kept(stories, tmp_path):
    path, model = stories
    a = _arrays(PROMPTS, RESPONSES)
    a["has_behaviour"][1] = True
    a["behaviour_logprobs"][1] = [-1.0, -2.0, -3.0, -4.0]
    out = fill_behaviour_logprobs(a, model_path=path, model=model, cache_dir=None)
    np.testing.assert_array_equal(out["behaviour_logprobs"][1], [-1.0, -2.0, -3.0, -4.0])
    fresh = compute_behaviour_logprobs(model, a)
    np.testing.assert_allclose(out["behaviour_logprobs"][[0, 2]], fresh[[0, 2]], atol=1e-5)
    np.testing.assert_array_equal(out["has_behaviour"], [False, True, False])


def test_load_scored_arrays_end_to_end(stories, tmp_path, stories_tokenizer, monkeypatch):
    path, model = stories
    monkeypatch.setenv("JAXPPO_CACHE_DIR", str(tmp_path / "cache"))
    p = tmp_path / "d.jsonl"
    rows = [{"prompt": "Once upon a time", "response": " there was a dog.", "score": 1.0},
            {"prompt": "The cat", "response": " sat.", "score": 0.0, "behaviour_logprobs": [-0.5, -0.5, -0.5]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert stories_tokenizer(" sat.", add_special_tokens=False)["input_ids"] == [262, 294, 426]  # 3 tokens
    cfg = DataConfig(path=str(p), max_prompt_length=8, max_response_length=8)
    arrays, rep = load_scored_arrays(cfg, stories_tokenizer, reference_path=path, reference=model)
    np.testing.assert_array_equal(arrays["behaviour_logprobs"][1, :3], [-0.5] * 3)
    np.testing.assert_array_equal(arrays["has_behaviour"], [False, True])
    assert arrays["behaviour_logprobs"][0, :arrays["response_mask"][0].sum()].max() < 0
    assert rep.notes["behaviour_logprobs_computed"] == 1
    # cached in the cache folder, never beside the dataset (datasets may sit in read-only asset folders)
    assert any((tmp_path / "cache").iterdir())
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cache", "d.jsonl"]


def test_cache_key_includes_param_and_compute_dtypes(stories, tmp_path):
    """A bfloat16 reference never reads the float32 cache (and its numbers really differ), nor the reverse."""
    import jax.numpy as jnp

    from jaxppo.hf import load_pretrained

    path, model32 = stories
    a = _arrays(PROMPTS, RESPONSES)
    fp = model_fingerprint(path)
    keys = {cache_key(fp, a, param_dtype=p, compute_dtype=c)
            for p, c in [("float32", "float32"), ("bfloat16", "bfloat16"), ("float32", "bfloat16"),
                         ("bfloat16", "float32")]}
    assert len(keys) == 4
    assert cache_key(fp, a, param_dtype=jnp.bfloat16, compute_dtype="bfloat16") == \
        cache_key(fp, a, param_dtype="bfloat16", compute_dtype=jnp.dtype("bfloat16"))

    first = fill_behaviour_logprobs(a, model_path=path, model=model32, cache_dir=tmp_path)
    model16 = load_pretrained(path, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    loads = []

    def loader16(p):
        loads.append(p)
        return model16

    # no model given, bf16 requested: the float32 file must not be read
    bf = fill_behaviour_logprobs(a, model_path=path, load_model=loader16, cache_dir=tmp_path,
                                 param_dtype="bfloat16", compute_dtype="bfloat16")
    assert len(loads) == 1 and len(list(tmp_path.glob("behaviour-*.safetensors"))) == 2
    fresh16 = compute_behaviour_logprobs(model16, a)
    np.testing.assert_array_equal(bf["behaviour_logprobs"], fresh16)
    assert not np.allclose(bf["behaviour_logprobs"], first["behaviour_logprobs"], atol=1e-6)
    # the dtypes are read from a given model: the bf16 model hits the bf16 file, the f32 model the f32 one
    again16 = fill_behaviour_logprobs(a, model_path=path, model=model16, cache_dir=tmp_path)
    again32 = fill_behaviour_logprobs(a, model_path=path, model=model32, cache_dir=tmp_path)
    np.testing.assert_array_equal(again16["behaviour_logprobs"], bf["behaviour_logprobs"])
    np.testing.assert_array_equal(again32["behaviour_logprobs"], first["behaviour_logprobs"])
    # a loader without explicit dtypes: the file is written under the LOADED model's (bf16) key
    loads.clear()
    d2 = tmp_path / "second"
    fill_behaviour_logprobs(a, model_path=path, load_model=loader16, cache_dir=d2)
    (f,) = d2.glob("behaviour-*.safetensors")
    assert f.name == (tmp_path / f"behaviour-{cache_key(fp, a, param_dtype='bfloat16', compute_dtype='bfloat16')[:32]}"
                      ".safetensors").name


def test_a_quantized_base_never_reads_the_float_cache(stories, tmp_path):
    """The log-probs of an int8/nf4 base (QLoRA's reference) differ from the float weights': their cache keys
    differ, an unquantized model's key is unchanged, and fill_behaviour_logprobs computes (not reads) them."""
    from jaxppo.data.behaviour import base_format
    from jaxppo.hf import load_pretrained
    from jaxppo.models.adapters import attach_lora
    from jaxppo.models.lora import LoraSpec

    path, model32 = stories
    a = _arrays(PROMPTS, RESPONSES)
    fp = model_fingerprint(path)
    assert cache_key(fp, a) == cache_key(fp, a, quantized=None)
    assert len({cache_key(fp, a), cache_key(fp, a, quantized="int8"), cache_key(fp, a, quantized="nf4")}) == 3
    first = fill_behaviour_logprobs(a, model_path=path, model=model32, cache_dir=tmp_path)
    q = attach_lora(load_pretrained(path), LoraSpec(rank=2, alpha=4.0, quantize_base="int8"))
    assert base_format(q) == "int8" and base_format(model32) is None
    second = fill_behaviour_logprobs(a, model_path=path, model=q, cache_dir=tmp_path)
    want = compute_behaviour_logprobs(q, a)
    np.testing.assert_allclose(second["behaviour_logprobs"], want, atol=1e-6)
    assert np.max(np.abs(second["behaviour_logprobs"] - first["behaviour_logprobs"])) > 1e-5


def test_packed_pass_equals_padded_and_has_its_own_cache_key(stories, tmp_path, caplog):
    """``packing=True``: the same log-probs on the real stories260K (5 rows in batches of 2: the last one filled
    with dummies), one log line counting the compiled packed shapes, and a cache key of its own."""
    path, model = stories
    a = _arrays(PROMPTS + PROMPTS[:2], RESPONSES + RESPONSES[1:3])
    padded = compute_behaviour_logprobs(model, a, batch_size=2)
    with caplog.at_level("INFO", logger="jaxppo.packing"):
        packed = compute_behaviour_logprobs(model, a, batch_size=2, packing=True)
    np.testing.assert_allclose(packed, padded, atol=1e-5, rtol=1e-5)
    assert (packed[a["response_mask"] == 0] == 0).all()
    assert any("behaviour log-prob pass: packed into" in r.getMessage() for r in caplog.records)
    fp = model_fingerprint(path)
    assert cache_key(fp, a) == cache_key(fp, a, packing=False) != cache_key(fp, a, packing=True)
    out = fill_behaviour_logprobs(a, model_path=path, model=model, cache_dir=tmp_path, batch_size=2, packing=True)
    np.testing.assert_allclose(out["behaviour_logprobs"], padded, atol=1e-5, rtol=1e-5)
