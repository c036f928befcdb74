"""Hugging Face / GGUF import and export for ``jaxppo.models``."""

from jaxppo.hf.assets import smollm2_gguf_path
from jaxppo.hf.load import load_pretrained, load_tokenizer, load_weights, open_source
from jaxppo.hf.paths import MODEL_ALIASES, resolve_model_path, tokenizer_path
from jaxppo.hf.save import save_pretrained

__all__ = ["MODEL_ALIASES", "load_pretrained", "load_tokenizer", "load_weights", "open_source", "resolve_model_path",
           "save_pretrained", "smollm2_gguf_path", "tokenizer_path"]
