"""The policy model and tokenizer a config's ``model`` section names: loaded (weights read onto the mesh) or
abstract (``ShapeDtypeStruct`` leaves from ``config.json`` contents, nothing read or allocated).

Both carry the adapters of ``model.lora`` when it asks for them (``rank > 0``; base quantized with
``quantize_base``); the loaded one gets them right after loading, before any reference pass reads the model
(``models.adapters.with_adapters``). ``jaxppo.trainer.policy`` splits either model for training.
"""

from __future__ import annotations

from typing import Any

from flax import nnx


def lm_config(hf_config: dict, model_cfg: Any):
    """The ``LMConfig`` that ``load_pretrained`` builds for ``config.json`` contents and ``cfg.model``."""
    from jaxppo.models import LMConfig
    from jaxppo.models.config import default_scan_layers

    return LMConfig.from_hf(hf_config, param_dtype=model_cfg.param_dtype, compute_dtype=model_cfg.compute_dtype,
                            remat=model_cfg.remat, scan_layers=default_scan_layers(model_cfg.compute_dtype),
                            attention=model_cfg.attention)


def check_attention_backend(model_cfg: Any, backend: str | None = None) -> None:
    """ConfigError (one line, naming ``model.attention``) when ``model.attention`` is a fused kernel that does not
    run on ``backend`` (None: the process's, ``jax.default_backend()``); ``models.attention.check_backend``."""
    import jax

    from jaxppo.config import ConfigError
    from jaxppo.models.attention import check_backend

    try:
        check_backend(model_cfg.attention, backend or jax.default_backend())
    except ValueError as e:
        raise ConfigError(str(e)) from None


def load_model(model_cfg: Any, path: str | None = None, *, mesh=None, rules=None, remat: Any = None,
               adapters_seed: int | None = None):
    """The ``CausalLM`` at ``path`` (default ``model.path``; a Hugging Face folder or ``.gguf``) with the dtypes of
    ``model_cfg``, placed on ``mesh`` by ``rules`` when given; ``remat`` None keeps the loader's default. With
    ``adapters_seed`` the adapters of ``model.lora`` are attached, seeded by it (module doc). ``model.attention``
    is checked against the process's backend first (``check_attention_backend``)."""
    from jaxppo.hf.load import load_pretrained
    from jaxppo.hf.paths import resolve_model_path
    from jaxppo.models.adapters import with_adapters
    from jaxppo.models.dtypes import dtype_of

    check_attention_backend(model_cfg)
    kw = {} if remat is None else {"remat": remat}
    model = load_pretrained(resolve_model_path(model_cfg.path) if path is None else path,
                            dtype=dtype_of(model_cfg.param_dtype), compute_dtype=dtype_of(model_cfg.compute_dtype),
                            mesh=mesh, rules=rules, attention=model_cfg.attention, **kw)
    if adapters_seed is not None:
        model = with_adapters(model, model_cfg.lora, seed=adapters_seed, mesh=mesh, rules=rules)
    return model


def abstract_model(hf_config: dict, model_cfg: Any):
    """:func:`load_model` with adapters as ``ShapeDtypeStruct`` leaves: the model of ``config.json`` contents and
    ``model_cfg`` (the adapters of ``model.lora`` included), unsharded."""
    from jaxppo.models import CausalLM
    from jaxppo.models.lora import spec_from_config

    lm_cfg = lm_config(hf_config, model_cfg)
    spec = spec_from_config(model_cfg.lora)
    if spec is not None:
        lm_cfg = lm_cfg.replace(lora=spec)
    return nnx.eval_shape(lambda: CausalLM(lm_cfg, rngs=nnx.Rngs(0)))


def load_tokenizer_of(model_cfg: Any):
    """The tokenizer of ``model.tokenizer_path`` (default ``model.path``)."""
    from jaxppo.hf.load import load_tokenizer
    from jaxppo.hf.paths import tokenizer_path

    return load_tokenizer(tokenizer_path(model_cfg))


__all__ = ["abstract_model", "check_attention_backend", "lm_config", "load_model", "load_tokenizer_of"]
