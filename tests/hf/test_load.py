"""load_pretrained on real and synthetic checkpoints, and its errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.hf import load_pretrained, load_tokenizer
from jaxppo.hf.safetensors_io import SafetensorsFile, save_file
from jaxppo.models import generate
from tests.hf.tiny import save_hf_model


def test_stories260k_greedy_matches_reference(shared_dir):
    """KV-cache greedy decoding reproduces llama2.c's reference continuation."""
    ref = json.loads((shared_dir / "reference" / "stories260K_greedy.json").read_text())
    path = shared_dir / "models" / "stories260K"
    model = load_pretrained(path)
    tok = load_tokenizer(path)
    assert tok(ref["prompt"]).input_ids == ref["prompt_ids"]
    prompt = np.asarray([ref["prompt_ids"]], np.int32)
    out = generate(model, prompt, np.ones_like(prompt), jax.random.key(0), max_new_tokens=ref["max_new_tokens"],
                   temperature=0.0)
    assert int(np.asarray(out.mask).sum()) == ref["max_new_tokens"]
    text = tok.decode(ref["prompt_ids"] + np.asarray(out.tokens)[0].tolist(), skip_special_tokens=True)
    assert text.startswith(ref["expected_text_prefix"]), text


def test_bfloat16_params_and_compute(shared_dir):
    path = shared_dir / "models" / "stories260K"
    m32 = load_pretrained(path)
    m16 = load_pretrained(path, dtype=jnp.bfloat16)
    assert m16.model.layers.q.get_value().dtype == jnp.bfloat16
    mixed = load_pretrained(path, dtype=jnp.float32, compute_dtype=jnp.bfloat16)
    assert mixed.model.layers.q.get_value().dtype == jnp.float32
    ids = jnp.array([[1, 403, 407, 261, 378]])
    ref = np.asarray(m32(ids))
    for m in (m16, mixed):
        out = np.asarray(m(ids))
        assert out.dtype == np.float32
        assert np.max(np.abs(out - ref)) < 0.15 * np.max(np.abs(ref))
        assert (out[0, -1].argmax() == ref[0, -1].argmax())


def test_sharded_load_places_params_and_matches(shared_dir):
    from jaxppo.parallel import make_mesh
    path = shared_dir / "models" / "stories260K"
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    m = load_pretrained(path, mesh=mesh)
    q = m.model.layers.q.get_value()
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (5, 32, 4, 8)
    ref = load_pretrained(path)
    ids = jnp.array([[1, 403, 407, 261, 378]])
    np.testing.assert_allclose(np.asarray(m(ids)), np.asarray(ref(ids)), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------ errors

def _rewrite(path, drop=(), add=None, reshape=None):
    f = SafetensorsFile(path / "model.safetensors")
    tensors = {n: np.array(f.get(n)) for n in f.names() if n not in drop}
    if reshape:
        tensors[reshape] = tensors[reshape][:-1]
    tensors.update(add or {})
    del f
    save_file([(n, a.shape, a.dtype) for n, a in tensors.items()], tensors.__getitem__, path / "model.safetensors")


def test_missing_tensor_is_named(tmp_path):
    save_hf_model("llama", tmp_path)
    _rewrite(tmp_path, drop=("model.layers.1.mlp.up_proj.weight",))
    with pytest.raises(ValueError, match=r"missing tensor\(s\): 'model.layers.1.mlp.up_proj.weight'"):
        load_pretrained(tmp_path)


def test_extra_tensor_is_named(tmp_path):
    save_hf_model("llama", tmp_path)
    _rewrite(tmp_path, add={"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\).*'model.layers.0.self_attn.q_proj.bias'"):
        load_pretrained(tmp_path)


def test_misshaped_tensor_is_named(tmp_path):
    save_hf_model("qwen2", tmp_path)
    _rewrite(tmp_path, reshape="model.layers.0.self_attn.k_proj.bias")
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.k_proj.bias' has shape \(15,\), expected \(16,\)"):
        load_pretrained(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    save_hf_model("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*not supported"):
        load_pretrained(tmp_path)


def test_missing_config_field_is_named(tmp_path):
    save_hf_model("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing required field\(s\) \['intermediate_size'\]"):
        load_pretrained(tmp_path)


def test_pickle_weights_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match=r"pickle-based weights are not loaded"):
        load_pretrained(tmp_path)


def test_sharded_index_directory_loads(tmp_path):
    import transformers
    hf = save_hf_model("qwen2", tmp_path / "one")
    hf.save_pretrained(str(tmp_path / "many"), safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "many" / "model.safetensors.index.json").is_file()
    a, b = load_pretrained(tmp_path / "one"), load_pretrained(tmp_path / "many")
    ids = jnp.array([[5, 6, 7, 8]])
    np.testing.assert_array_equal(np.asarray(a(ids)), np.asarray(b(ids)))
    assert isinstance(hf, transformers.PreTrainedModel)
