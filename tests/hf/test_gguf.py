"""GGUF import: tiny GGUF files written like llama.cpp's converter, their errors, and the real SmolLM2 GGUF."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.hf import load_pretrained, load_tokenizer, smollm2_gguf_path
from jaxppo.models import generate
from tests.hf.tiny import hf_logits, left_padded_batch, make_hf_model

_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k permutation (half-split rotary rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_model, path, *, arch="llama", permute=True, q8_embedding=False):
    """Write a transformers model as GGUF the way llama.cpp does (names, permutation, metadata)."""
    import gguf
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in hf_model.state_dict().items():
        a = t.detach().numpy().astype(np.float32)
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if permute and (".q_proj." in name or ".k_proj." in name):
            a = _llama_cpp_permute(a, c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads)
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            part, suffix = rest.rsplit(".", 1)
            g = f"blk.{i}.{_NAMES[part]}.{suffix}"
        if g == "token_embd.weight" and q8_embedding:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(g, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(g, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("family,arch,permute", [("smollm2", "llama", True), ("qwen2", "qwen2", False)])
def test_tiny_gguf_matches_transformers(family, arch, permute, tmp_path):
    import transformers
    hf = make_hf_model(family)
    path = write_gguf(hf, tmp_path / "tiny.gguf", arch=arch, permute=permute)
    model = load_pretrained(path)
    assert model.config.tie_word_embeddings == hf.config.tie_word_embeddings
    assert model.config.architecture == hf.config.model_type
    ids, mask = left_padded_batch(hf.config.vocab_size)
    real = mask.astype(bool)
    got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    assert np.max(np.abs(got[real] - hf_logits(hf, ids, mask)[real])) < 1e-4
    assert isinstance(hf, transformers.PreTrainedModel)


def test_quantized_gguf_tensor_is_dequantized(tmp_path):
    hf = make_hf_model("llama")  # untied, rows of 32 values (Q8_0 blocks)
    path = write_gguf(hf, tmp_path / "q8.gguf", q8_embedding=True)
    model = load_pretrained(path)
    emb = np.asarray(model.model.embed.get_value())
    ref = hf.model.embed_tokens.weight.detach().numpy()
    err = np.abs(emb - ref)
    # Q8_0: blocks of 32 values with one fp16 scale max|x|/127, so the error is at most half a step
    assert 0 < err.max() <= np.abs(ref).max() / 127 * 0.51
    np.testing.assert_array_equal(np.asarray(model.lm_head.get_value()), hf.lm_head.weight.detach().numpy().T)


def test_unsupported_gguf_architecture_is_named(tmp_path):
    hf = make_hf_model("llama")
    path = write_gguf(hf, tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ValueError, match=r"general.architecture='gpt2' is not supported"):
        load_pretrained(path)


def test_not_a_gguf_file_is_named(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"definitely not gguf")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_pretrained(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "absent.gguf")


@pytest.mark.slow
def test_smollm2_gguf_answers_paris():
    path = smollm2_gguf_path()
    model = load_pretrained(path)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings
    tok = load_tokenizer(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    ids = np.asarray([prompt], np.int32)
    out = generate(model, ids, np.ones_like(ids), jax.random.key(0), max_new_tokens=12, temperature=0.0,
                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    n = int(np.asarray(out.mask).sum())
    answer = tok.decode(np.asarray(out.tokens)[0, :n], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.999])
def test_truncated_gguf_names_the_file_and_the_tensor(tmp_path, keep):
    """A GGUF cut short (an interrupted download) fails naming the file and the first tensor (in file order) whose
    data runs past the cut, not with the reader's "cannot reshape array of size ... into shape ..."."""
    from gguf import GGUFReader

    hf = make_hf_model("llama")
    path = write_gguf(hf, tmp_path / "full.gguf")
    data = path.read_bytes()
    n = int(len(data) * keep) // 32 * 32       # GGUF aligns tensor data to 32 bytes
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:n])
    first_cut = next(t for t in GGUFReader(str(path)).tensors if t.data_offset + t.n_bytes > n)
    with pytest.raises(ValueError, match=rf"^{cut}: the GGUF file is truncated: it has {n} bytes but tensor "
                                         rf"'{re.escape(first_cut.name)}' \(shape \(\d+(, \d+)?,?\)\) needs bytes up "
                                         rf"to {first_cut.data_offset + first_cut.n_bytes} \(an incomplete "):
        load_pretrained(cut)


def test_gguf_cut_inside_its_header_is_named_truncated_or_damaged(tmp_path):
    hf = make_hf_model("llama")
    data = write_gguf(hf, tmp_path / "full.gguf").read_bytes()
    cut = tmp_path / "head.gguf"
    cut.write_bytes(data[:40])
    with pytest.raises(ValueError, match=rf"^{cut}: the GGUF file is truncated or damaged \(40 bytes; the GGUF "):
        load_pretrained(cut)


def test_a_gguf_file_is_parsed_once_per_version(tmp_path):
    """``open_source`` hands back the same parsed file while the file is unchanged, and parses it again once it is
    rewritten (new size and modification time)."""
    from jaxppo.hf import open_source

    path = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf")
    first = open_source(path)
    assert open_source(path) is first and open_source(str(path)) is first
    emb = first.get("model.embed_tokens.weight")
    write_gguf(make_hf_model("llama"), tmp_path / "other.gguf", q8_embedding=True).replace(path)
    second = open_source(path)
    assert second is not first
    assert not np.array_equal(second.get("model.embed_tokens.weight"), emb)   # the Q8_0-rounded embedding


@pytest.mark.slow
def test_gguf_tokenizer_copies_are_independent():
    """The tokenizer of a ``.gguf`` file is converted once; each call gets its own copy."""
    path = smollm2_gguf_path()
    a, b = load_tokenizer(path), load_tokenizer(path)
    assert a is not b and a.get_vocab() == b.get_vocab()
    assert a("Once upon a time").input_ids == b("Once upon a time").input_ids
    template = b.chat_template
    a.chat_template = "{{ messages[0]['content'] }}"
    assert b.chat_template == template and load_tokenizer(path).chat_template == template
