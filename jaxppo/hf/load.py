"""Load Hugging Face checkpoints (safetensors directories or ``.gguf`` files) into ``CausalLM``.

Loading is tensor by tensor: the model is first built abstractly (``nnx.eval_shape``, no memory),
then every parameter is created directly with its target sharding (from its logical axes and the
mesh rules) and each HF tensor is converted on the host and written into its row of the stacked
layer parameter on device. The host never holds more than one tensor at a time.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from jaxppo.hf.mapping import check_names_and_shapes, expected_names, tensor_maps
from jaxppo.hf.safetensors_io import SafetensorsFile
from jaxppo.models.config import LMConfig, default_scan_layers
from jaxppo.models.sharding import mesh_spec
from jaxppo.models.transformer import CausalLM


class TensorSource(Protocol):
    """A checkpoint seen as HF-named tensors in HF layout."""

    def config_dict(self) -> dict: ...

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def get(self, name: str) -> np.ndarray: ...


class HFDirSource:
    """``config.json`` + ``model.safetensors`` or ``model.safetensors.index.json`` (sharded) in a directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        cfg_file = self.path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{self.path}: no config.json (expected a Hugging Face model directory)")
        self._config = json.loads(cfg_file.read_text())
        single = self.path / "model.safetensors"
        index = self.path / "model.safetensors.index.json"
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, str] = {}
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: no 'weight_map' object")
            for name, fname in weight_map.items():
                if fname not in self._files:
                    fpath = self.path / fname
                    if not fpath.is_file():
                        raise FileNotFoundError(f"{index}: tensor {name!r} is in {fname}, which does not exist")
                    self._files[fname] = SafetensorsFile(fpath)
                if name not in self._files[fname].header:
                    raise ValueError(f"{index}: tensor {name!r} is listed in {fname} but not stored there")
                self._where[name] = fname
        elif single.is_file():
            f = SafetensorsFile(single)
            self._files[single.name] = f
            self._where = {n: single.name for n in f.names()}
        else:
            bins = sorted(p.name for p in self.path.glob("*.bin")) + sorted(p.name for p in self.path.glob("*.pt*"))
            hint = f" (found {bins}: pickle-based weights are not loaded for safety; convert them to safetensors)" \
                if bins else ""
            raise FileNotFoundError(f"{self.path}: no model.safetensors or model.safetensors.index.json{hint}")

    def config_dict(self) -> dict:
        return dict(self._config)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: self._files[f].shape(n) for n, f in self._where.items()}

    def get(self, name: str) -> np.ndarray:
        return self._files[self._where[name]].get(name)


def _file_key(path: Path) -> tuple[str, int, int]:
    """``(resolved path, size, mtime_ns)``: a file rewritten in place gets a new key."""
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


@lru_cache(maxsize=4)
def _gguf_source(path: str, key: tuple[str, int, int]) -> TensorSource:
    from jaxppo.hf.gguf import GGUFSource
    return GGUFSource(path)


def open_source(path: str | Path) -> TensorSource:
    """A ``TensorSource`` for a HF directory or a ``.gguf`` file. A ``.gguf`` file is parsed once per process and
    file version (path, size, modification time); the source is read-only, so callers share it."""
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return _gguf_source(str(path), _file_key(path))
    if path.is_dir():
        return HFDirSource(path)
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    raise ValueError(f"model path {path}: expected a Hugging Face directory or a .gguf file")


def _dtype_name(dtype) -> str:
    return jnp.dtype(dtype).name


def _resolve(model: nnx.Module, dotted: str) -> nnx.Variable:
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@lru_cache(maxsize=None)
def _zeros_fn(shape, dtype, sharding):
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


@lru_cache(maxsize=None)
def _set_row_fn(sharding):
    return jax.jit(lambda buf, row, i: jax.lax.dynamic_update_index_in_dim(buf, row, i, 0),
                   donate_argnums=0, out_shardings=sharding)


def load_weights(model: CausalLM, source: TensorSource, *, mesh: Mesh | None = None,
                 rules: Mapping | None = None, where: str = "checkpoint") -> CausalLM:
    """Fill every parameter of ``model`` (abstract or concrete) from ``source``, in place.

    Checks names and shapes first (ValueError naming each missing / unexpected / mis-shaped tensor).
    """
    cfg = model.config
    shapes = source.shapes()
    check_names_and_shapes(cfg, shapes, where)
    by_param: dict[str, list] = {}
    for name, (m, layer) in expected_names(cfg).items():
        by_param.setdefault(m.ours, []).append((name, m, layer))
    for ours, items in by_param.items():
        var = _resolve(model, ours)
        abstract = var.get_value()
        shape, dtype = tuple(abstract.shape), jnp.dtype(abstract.dtype)
        spec = mesh_spec(var, mesh, rules) if mesh is not None else None
        full = NamedSharding(mesh, spec) if mesh is not None else SingleDeviceSharding(jax.local_devices()[0])
        if items[0][1].per_layer:
            row_sh = NamedSharding(mesh, PartitionSpec(*tuple(spec)[1:])) if mesh is not None else full
            buf = _zeros_fn(shape, dtype, full)()
            set_row = _set_row_fn(full)
            for name, m, layer in items:
                row = np.asarray(m.to_ours(source.get(name)), dtype=dtype)
                buf = set_row(buf, jax.device_put(row, row_sh), layer)
                del row
            value = buf
        else:
            (name, m, _), = items
            value = jax.device_put(np.asarray(m.to_ours(source.get(name)), dtype=dtype), full)
        if tuple(value.shape) != shape:
            raise ValueError(f"{where}: parameter {ours} got shape {value.shape}, expected {shape}")
        var.set_value(value)
    return model


def load_pretrained(path: str | Path, *, dtype=jnp.float32, compute_dtype=None, mesh: Mesh | None = None,
                    rules: Mapping | None = None, remat: bool | str = "auto",
                    scan_layers: bool | str | None = None, attention: str = "auto") -> CausalLM:
    """A ``CausalLM`` with the weights of a HF directory (``config.json`` + safetensors) or a ``.gguf`` file.

    ``dtype``: parameter dtype; ``compute_dtype``: activation dtype (default ``dtype``). With ``mesh``
    every parameter is placed on it following its logical axes and ``rules`` (``jaxppo.parallel``).
    ``remat``: ``LMConfig.remat`` ("auto": save only the matrix products' outputs for the backward where that was
    measured faster, ``LMConfig.remat_policy``).
    ``scan_layers``: ``LMConfig.scan_layers``; None: ``models.config.default_scan_layers`` of the compute dtype
    (float32 scans; 16-bit unrolls on the CPU).
    ``attention``: ``LMConfig.attention`` (``jaxppo.models.attention``).
    """
    source = open_source(path)
    compute = _dtype_name(compute_dtype if compute_dtype is not None else dtype)
    cfg = LMConfig.from_hf(source.config_dict(), param_dtype=_dtype_name(dtype), compute_dtype=compute, remat=remat,
                           scan_layers=default_scan_layers(compute) if scan_layers is None else scan_layers,
                           attention=attention)
    model = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    return load_weights(model, source, mesh=mesh, rules=rules, where=str(path))


@lru_cache(maxsize=4)
def _gguf_tokenizer(path: str, key: tuple[str, int, int]):
    from transformers import AutoTokenizer
    p = Path(path)
    try:
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    except ImportError as e:  # transformers' GGUF reader imports torch
        raise ImportError(f"reading the tokenizer of {p.name} needs torch (transformers' GGUF reader): "
                          f"pip install -e '.[gguf]' (torch==2.13.0); original error: {e}") from e


def load_tokenizer(path: str | Path):
    """A transformers tokenizer from a local HF directory or ``.gguf`` file (chat template included). A ``.gguf``
    file's tokenizer is converted once per process and file version; each call returns its own copy (callers may
    set a chat template on theirs)."""
    from transformers import AutoTokenizer
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return copy.deepcopy(_gguf_tokenizer(str(path), _file_key(path)))
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer path {path} is not a directory or a .gguf file")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


__all__ = ["HFDirSource", "TensorSource", "load_pretrained", "load_tokenizer", "load_weights", "open_source",
           "tensor_maps"]
