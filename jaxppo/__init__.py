"""jaxppo: offline RLHF of causal language models with PPO in JAX/Flax NNX.

Layers (imports only point down): cli -> trainer -> data/rewards/hf/models/parallel -> replay -> ops.
"""

__version__ = "0.1.0"
