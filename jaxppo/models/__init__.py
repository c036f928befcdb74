"""Flax NNX decoder-only language models (Llama / Qwen2 / Mistral / SmolLM2), heads and generation."""

from jaxppo.models.config import ARCHITECTURES, LMConfig
from jaxppo.models.generation import GenerationOutput, generate, sample_from_logits
from jaxppo.models.heads import RewardModel, ScalarHead, ValueModel, last_token_index
from jaxppo.models.sharding import named_shardings, partition_specs, shard_model
from jaxppo.models.transformer import CausalLM, KVCache, Transformer, param_count

__all__ = ["ARCHITECTURES", "CausalLM", "GenerationOutput", "KVCache", "LMConfig", "RewardModel", "ScalarHead",
           "Transformer", "ValueModel", "generate", "last_token_index", "named_shardings", "param_count",
           "partition_specs", "sample_from_logits", "shard_model"]
