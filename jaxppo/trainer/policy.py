"""The policy every trainer builds from ``cfg.model``: the trainable/frozen split and the reference.

One place makes the two choices of a policy:

- full weights or adapters (``model.lora.rank > 0``, ``jaxppo.models.adapters``): with full weights the trainable
  part is every parameter and the reference a copy of them; with adapters the trainable part is the adapter
  factors, the frozen base (quantized with ``model.lora.quantize_base``) stays outside the train state and the
  reference is the base with its adapters off (all-zero factors, no copy of the weights);
- real or abstract arrays: ``jaxppo.hf.from_config.load_model`` reads the weights (a Hugging Face folder or
  ``.gguf``) onto the mesh, ``abstract_model`` builds the same model from ``config.json`` contents as
  ``ShapeDtypeStruct`` leaves (the memory plan). :func:`split_policy` splits either into a :class:`Policy`;
  abstract leaves carry the shardings the real ones get.

A run that holds a :class:`Policy` (``parts``) and a train state whose ``actor`` field is the trainable part gets
``policy()``, ``reference()`` and ``params_of()`` from :class:`PolicyRun`. :func:`load_policy` is the loading both
trainers start from: the mesh, the resolved model path, the tokenizer and the model on the mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo.models.adapters import merge_with_base, reference_adapters, split_frozen
from jaxppo.optim import split_params


@dataclasses.dataclass
class LoadedPolicy:
    """What a trainer loads from ``cfg.model`` and ``cfg.mesh`` before it reads its data (:func:`load_policy`)."""
    mesh: Any
    rules: dict            # logical axis -> mesh axes (``trainer.mesh.mesh_from_config``)
    model_path: str        # ``cfg.model.path`` resolved (``hf.paths.resolve_model_path``)
    tokenizer: Any
    model: nnx.Module      # on the mesh; with adapters attached when ``model.lora.rank > 0``


def load_policy(cfg: Any, devices, *, tokenizer: Any = None) -> LoadedPolicy:
    """The mesh of ``cfg.mesh`` over ``devices``, ``cfg.model``'s resolved path and tokenizer (``tokenizer``: the
    one the caller already loaded with ``hf.from_config.load_tokenizer_of``), and the model loaded onto the mesh
    with ``model.remat`` (``hf.from_config.load_model``), its adapters initialised from ``trainer.seed``."""
    from jaxppo.hf.from_config import load_model, load_tokenizer_of
    from jaxppo.hf.paths import resolve_model_path
    from jaxppo.trainer.mesh import mesh_from_config

    mesh, rules = mesh_from_config(cfg.mesh, list(devices))
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer_of(cfg.model) if tokenizer is None else tokenizer
    model = load_model(cfg.model, model_path, mesh=mesh, rules=rules, remat=cfg.model.remat,
                       adapters_seed=cfg.trainer.seed)
    return LoadedPolicy(mesh=mesh, rules=rules, model_path=model_path, tokenizer=tokenizer, model=model)


@dataclasses.dataclass
class Policy:
    """A policy split for training: ``graphdef`` with ``params`` (the trainable part: all weights, or the adapter
    factors) and ``base`` (adapters: the frozen rest, shared by policy, reference and a critic on it; else None).
    ``ref_params`` is the reference's trainable part: a copy of the initial ``params``, or all-zero factors."""
    graphdef: Any
    params: Any
    ref_params: Any
    base: Any = None

    def model(self, params: Any) -> nnx.Module:
        """The policy module with trainable part ``params``."""
        return merge_with_base(self.graphdef, params, self.base)

    def reference(self) -> nnx.Module:
        """The frozen initial policy: with adapters the base with its adapters off (no copy of its weights)."""
        return merge_with_base(self.graphdef, self.ref_params, self.base)

    def params_of(self, params: Any) -> Any:
        """What a jitted function of the whole model takes: ``params``, or ``(params, base)`` with adapters."""
        return params if self.base is None else (params, self.base)

    @property
    def reference_weights(self) -> Any:
        """The weights the reference holds beyond the train state: the copy of the parameters, or the base."""
        return self.ref_params if self.base is None else self.base


class PolicyRun:
    """The policy methods of a run with a :class:`Policy` in ``parts`` and the current trainable part in
    ``state.actor``."""
    parts: Policy
    state: Any

    @property
    def actor_gd(self) -> Any:
        return self.parts.graphdef

    @property
    def ref_params(self) -> Any:
        return self.parts.ref_params

    @property
    def base(self) -> Any:
        return self.parts.base

    def policy(self, params: Any = None) -> nnx.Module:
        """The policy with trainable part ``params`` (default: the run's current ``state.actor``)."""
        return self.parts.model(self.state.actor if params is None else params)

    def reference(self) -> nnx.Module:
        return self.parts.reference()

    def params_of(self, params: Any) -> Any:
        return self.parts.params_of(params)


def with_shardings(tree: Any, mesh, rules: dict) -> Any:
    """Abstract leaves of ``tree`` carrying the shardings its parameters get on ``mesh`` by ``rules``."""
    from jaxppo.models import named_shardings

    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                        named_shardings(tree, mesh, rules))


def is_abstract(tree: Any) -> bool:
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def split_policy(model: nnx.Module, *, mesh=None, rules: dict | None = None) -> Policy:
    """The :class:`Policy` of a loaded (``load_model``) or abstract (``abstract_model``) model: the split
    into trainable part and base follows ``model.config.lora``. Abstract leaves get the shardings of ``mesh`` and
    ``rules``, and the reference's trainable part is the trainable part's shapes (nothing is allocated)."""
    if model.config.lora is None:
        (graphdef, params), base = split_params(model), None
    else:
        graphdef, params, base = split_frozen(model)
    if is_abstract(params):
        params = with_shardings(params, mesh, rules)
        base = None if base is None else with_shardings(base, mesh, rules)
        return Policy(graphdef=graphdef, params=params, ref_params=params, base=base)
    if base is None:
        ref_params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    else:
        ref_params = reference_adapters(params)
    return Policy(graphdef=graphdef, params=params, ref_params=ref_params, base=base)


__all__ = ["LoadedPolicy", "Policy", "PolicyRun", "is_abstract", "load_policy", "split_policy", "with_shardings"]
