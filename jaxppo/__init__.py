"""jaxppo: offline RLHF of causal language models with PPO in JAX/Flax NNX.

Layers, bottom first (a module imports only its own package and lower ones; tests/test_layers.py): registry,
ops, parallel, config, replay, models, hf, data, rewards, trainer, config_names, sweeps, command lines.
"""

__version__ = "0.1.0"
