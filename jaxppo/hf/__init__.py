"""Hugging Face / GGUF import and export for ``jaxppo.models``."""

from jaxppo.hf.assets import smollm2_gguf_path
from jaxppo.hf.load import load_pretrained, load_tokenizer, load_weights, open_source
from jaxppo.hf.save import save_pretrained

__all__ = ["load_pretrained", "load_tokenizer", "load_weights", "open_source", "save_pretrained",
           "smollm2_gguf_path"]
