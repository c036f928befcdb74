"""Behaviour log-probs: computed once with the reference model when the data has none, and cached.

Layout: the model input is ``concat(prompt_ids, response_ids)`` [B, P+R] with mask
``concat(prompt_mask, response_mask)``; the log-prob of response token ``t`` is read from the
logits at position ``P + t - 1``::

    logp[b, t] = log_softmax(logits[b, P + t - 1])[response_ids[b, t]] · response_mask[b, t]

The pass is jitted and batched with one static batch shape (the last batch is padded with copies
of its first row and cut afterwards). Results are cached in a safetensors file named by a SHA-256
of (model fingerprint, parameter dtype, compute dtype, token arrays, shapes, layout version): a second
run with the same model, dtypes and data reads the file instead of running the model; anything else
changes the key (a bfloat16 run never reads float32 log-probs, nor the reverse).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxppo.data.report import DataReport
from jaxppo.models.sharding import batch_multiple
from jaxppo.parallel.host import all_processes, to_host

logger = logging.getLogger("jaxppo.data")

CACHE_VERSION = "2"
_TOKEN_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def response_logprobs(model: Callable, prompt_ids: jax.Array, prompt_mask: jax.Array, response_ids: jax.Array,
                      response_mask: jax.Array) -> jax.Array:
    """``log π(y_t | x, y_<t)`` [B, R] float32 of each response token (0 where ``response_mask`` is 0)."""
    P = prompt_ids.shape[1]
    R = response_ids.shape[1]
    ids = jnp.concatenate([prompt_ids, response_ids], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(jnp.int32)
    logits = model(ids, mask)[:, P - 1:P + R - 1].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    tok = jnp.take_along_axis(logp, response_ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return tok * response_mask.astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=0)
def _logprobs_pure(graphdef, state, prompt_ids, prompt_mask, response_ids, response_mask):
    return response_logprobs(nnx.merge(graphdef, state), prompt_ids, prompt_mask, response_ids, response_mask)


def compute_behaviour_logprobs(model: nnx.Module, arrays: Mapping[str, np.ndarray], *,
                               batch_size: int = 32, packing: bool = False) -> np.ndarray:
    """Response-token log-probs [N, R] float32 of ``arrays`` under ``model`` (batched, jitted). A causal LM runs the
    prompt of each block of rows that repeat it once (``jaxppo.models.shared_prompts``: ``n`` samples of a prompt in
    consecutive rows); the same log-probs up to float32 summation order.

    ``packing`` (a causal LM only): each batch of ``batch_size`` rows runs as packed rows without padding
    (:func:`packed_chunk_logprobs`); the same log-probs up to float32 summation order.
    """
    n = arrays["prompt_ids"].shape[0]
    if n == 0:
        return np.zeros((0, arrays["response_ids"].shape[1]), np.float32)
    graphdef, state = nnx.split(model)
    # a causal LM reads only the R response positions through its LM head, each block of rows that repeat one
    # prompt running it once (jaxppo.models.shared_prompts.rows_logprobs); any other callable model takes the
    # generic path
    from jaxppo.models.packing import ProgramLog
    from jaxppo.models.shared_prompts import rows_logprobs

    packed = packing and hasattr(model, "packed_logprobs")
    fn = rows_logprobs if hasattr(model, "shared_prefix_logprobs") else _logprobs_pure
    programs = ProgramLog()
    bs = min(batch_size, n)
    out = []
    for start in range(0, n, bs):
        chunk = [np.asarray(arrays[k][start:start + bs]) for k in _TOKEN_KEYS]
        m = chunk[0].shape[0]
        if packed:
            lp = packed_chunk_logprobs(graphdef, state, chunk, bs, batch_multiple(state), programs)
        else:
            if m < bs:  # keep one compiled shape
                chunk = [np.concatenate([c, np.repeat(c[:1], bs - m, axis=0)]) for c in chunk]
            lp = fn(graphdef, state, *chunk)
        out.append(to_host(lp)[:m])
    if packed:
        programs.log("behaviour log-prob pass")
    return np.concatenate(out).astype(np.float32)


def packed_chunk_logprobs(graphdef, state, chunk: list[np.ndarray], rows: int, multiple: int = 1,
                          programs=None) -> jax.Array:
    """``continuation_logprobs`` [rows, R] of ``chunk`` (the four token arrays of ``m <= rows`` sequences) through the
    packed layout (``jaxppo.models.packing.pack``, rows of ``P+R`` slots). Short chunks are filled to ``rows``
    sequences with one-token dummies (a prompt's last token, no response), so the response arrays keep one shape;
    ``programs`` (a ``packing.ProgramLog``) records the packed shape."""
    from jaxppo.models.packing import pack
    from jaxppo.models.transformer import packed_logprobs

    pi, pm, ri, rm = chunk
    m = pi.shape[0]
    if m < rows:
        extra = rows - m
        dummy_pm = np.zeros((extra, pm.shape[1]), pm.dtype)
        dummy_pm[:, -1] = 1
        pi = np.concatenate([pi, np.zeros((extra, pi.shape[1]), pi.dtype)])
        pm = np.concatenate([pm, dummy_pm])
        ri = np.concatenate([ri, np.zeros((extra, ri.shape[1]), ri.dtype)])
        rm = np.concatenate([rm, np.zeros((extra, rm.shape[1]), rm.dtype)])
    plan = pack(pi, pm, ri, rm, multiple_of=multiple)
    if programs is not None:
        programs.add(plan)
    return packed_logprobs(graphdef, state, plan, ri.astype(np.int32), rm.astype(np.int32))


def model_fingerprint(path: str | os.PathLike) -> str:
    """Identity of a checkpoint for cache keys: resolved path plus size and mtime of its weight files."""
    p = Path(path).resolve()
    files = [p] if p.is_file() else sorted(
        f for f in p.glob("*") if f.suffix in (".safetensors", ".gguf", ".json") and f.is_file())
    parts = [str(p)] + [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    return "|".join(parts)


def dtype_name(dtype: Any) -> str:
    """Canonical name of a dtype given as a string, numpy/jax dtype or scalar type (``"bfloat16"``, ...)."""
    return jnp.dtype(dtype).name


def model_dtypes(model: Any) -> tuple[str, str]:
    """``(param_dtype, compute_dtype)`` names of a jaxppo ``CausalLM`` (from its config)."""
    cfg = model.config
    return dtype_name(cfg.param_dtype), dtype_name(cfg.compute_dtype or cfg.param_dtype)


def base_format(model: Any) -> str | None:
    """The storage format of a quantized base (``"int8"`` / ``"nf4"``: ``model.lora.quantize_base``), else None."""
    lora = getattr(getattr(model, "config", None), "lora", None)
    return getattr(lora, "quantize_base", None)


def cache_key(model_id: str, arrays: Mapping[str, np.ndarray], *, param_dtype: Any = "float32",
              compute_dtype: Any = "float32", quantized: str | None = None, packing: bool = False) -> str:
    """SHA-256 (hex) of the model identity, its parameter and compute dtypes (both change the numbers), the
    format of a quantized base (``quantized``: int8 / nf4, which changes them too; None adds nothing, so the keys
    of unquantized models are unchanged), whether the pass ran packed (``packing``: the same numbers up to float
    summation order, not bit for bit; False adds nothing), the token arrays (bytes, dtypes, shapes) and the layout
    version."""
    h = hashlib.sha256()
    h.update(f"jaxppo-behaviour-v{CACHE_VERSION}\0{model_id}\0".encode())
    h.update(f"param_dtype={dtype_name(param_dtype)}\0compute_dtype={dtype_name(compute_dtype)}\0".encode())
    if quantized is not None:
        h.update(f"quantized_base={quantized}\0".encode())
    if packing:
        h.update(b"packing=1\0")
    for k in _TOKEN_KEYS:
        a = np.ascontiguousarray(arrays[k], dtype=np.int32)
        h.update(f"{k}:{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def default_cache_dir(data_path: str | None = None) -> Path:
    """``$JAXPPO_CACHE_DIR`` if set, else ``~/.cache/jaxppo`` (``$XDG_CACHE_HOME/jaxppo`` when that is set).

    Never the dataset's own folder: datasets often live in read-only or shared asset folders (``../shared``),
    and a cache written there would change them. Entries are content-addressed (model identity, dtypes, token
    arrays: :func:`cache_key`), so one cache folder safely serves every dataset and run. ``data_path`` is
    accepted for compatibility and ignored.
    """
    del data_path
    env = os.environ.get("JAXPPO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "jaxppo"


def _read_cache(path: Path, key: str, shape: tuple[int, int]) -> np.ndarray | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            arr = f.get_tensor("behaviour_logprobs")
    except Exception as e:  # noqa: BLE001 - a broken cache file is ignored and rewritten
        logger.warning("ignoring unreadable behaviour log-prob cache %s: %s", path, e)
        return None
    if meta.get("key") != key or tuple(arr.shape) != shape or arr.dtype != np.float32:
        logger.warning("ignoring behaviour log-prob cache %s: key/shape does not match", path)
        return None
    return arr


def _write_cache(path: Path, arr: np.ndarray, key: str, model_id: str) -> bool:
    from safetensors.numpy import save_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        save_file({"behaviour_logprobs": np.ascontiguousarray(arr, np.float32)}, str(tmp),
                  metadata={"key": key, "model": model_id[:2000], "version": CACHE_VERSION})
        os.replace(tmp, path)
        return True
    except OSError as e:
        logger.warning("could not write the behaviour log-prob cache %s: %s", path, e)
        return False


def fill_behaviour_logprobs(arrays: dict[str, np.ndarray], *, model_path: str,
                            model: nnx.Module | None = None, load_model: Callable[[str], nnx.Module] | None = None,
                            cache_dir: str | os.PathLike | None = None, batch_size: int = 32,
                            report: DataReport | None = None, param_dtype: Any = None,
                            compute_dtype: Any = None, packing: bool = False) -> dict[str, np.ndarray]:
    """``arrays`` with ``behaviour_logprobs`` of the rows whose ``has_behaviour`` is False computed by
    the reference model (``model``, or ``load_model(model_path)`` loaded only on a cache miss).

    The cache key includes the dtypes the log-probs are computed in: ``param_dtype``/``compute_dtype``
    when given, else those of ``model``, else float32 (``load_pretrained``'s default). A file is always
    written under the key of the model that actually produced it (read from the loaded model).

    Logged log-probs are kept as they are. ``has_behaviour`` stays the data's flag (True = logged);
    ``report.notes`` records how many rows were computed and whether the cache was used. ``packing``: the pass
    runs packed (:func:`compute_behaviour_logprobs`; part of the cache key).
    """
    missing = np.nonzero(~arrays["has_behaviour"])[0]
    out = dict(arrays)
    if missing.size == 0:
        return out
    sub = {k: np.asarray(arrays[k])[missing] for k in _TOKEN_KEYS}
    model_id = model_fingerprint(model_path)
    if model is not None:
        dts = model_dtypes(model)
        dts = (param_dtype or dts[0], compute_dtype or dts[1])
    else:
        dts = (param_dtype or "float32", compute_dtype or param_dtype or "float32")
    key = cache_key(model_id, sub, param_dtype=dts[0], compute_dtype=dts[1],
                    quantized=None if model is None else base_format(model), packing=packing)
    path = Path(cache_dir) / f"behaviour-{key[:32]}.safetensors" if cache_dir is not None else None
    shape = (int(missing.size), int(arrays["response_ids"].shape[1]))
    lp = _read_cache(path, key, shape) if path is not None and path.is_file() else None
    if not all_processes(lp is not None):  # computing is collective: all processes compute or none does
        lp = None
    hit = lp is not None
    if lp is None:
        if model is None:
            if load_model is None:
                from jaxppo.hf import load_pretrained

                load_model = load_pretrained
            model = load_model(model_path)
            if param_dtype is None and compute_dtype is None and hasattr(model, "config"):
                key = cache_key(model_id, sub, param_dtype=model_dtypes(model)[0],
                                compute_dtype=model_dtypes(model)[1], packing=packing)
                path = Path(cache_dir) / f"behaviour-{key[:32]}.safetensors" if cache_dir is not None else None
        lp = compute_behaviour_logprobs(model, sub, batch_size=batch_size, packing=packing)
        if path is not None:
            _write_cache(path, lp, key, model_id)
    full = np.array(arrays["behaviour_logprobs"], dtype=np.float32, copy=True)
    full[missing] = lp
    out["behaviour_logprobs"] = full
    if report is not None:
        report.notes["behaviour_logprobs_computed"] = int(missing.size)
        report.notes["behaviour_logprobs_cache"] = ("hit " if hit else "written ") + str(path) if path else "off"
    return out


def load_scored_arrays(data_cfg: Any, tokenizer: Any, *, reference_path: str | None = None,
                       reference: nnx.Module | None = None) -> tuple[dict[str, np.ndarray], DataReport]:
    """``load_rows`` + ``tokenize_rows`` + behaviour log-probs for rows that have none.

    With neither ``reference_path`` nor ``reference`` the missing log-probs stay 0 and
    ``has_behaviour`` False. With ``reference_path``, prompt + response lengths above the model's context are a
    ``ConfigError`` (:func:`~jaxppo.data.pipeline.check_context`) before any row is read. The cache goes to
    ``data.cache_dir`` or beside ``data.path``.
    """
    from jaxppo.data.pipeline import check_context, load_rows, tokenize_rows

    if reference_path is not None:
        check_context(data_cfg, reference_path)
    loaded = load_rows(data_cfg)
    arrays = tokenize_rows(loaded, tokenizer, data_cfg)
    if reference_path is not None or reference is not None:
        if reference_path is None:
            raise ValueError("reference_path is needed for the cache key of the behaviour log-probs")
        cache_dir = data_cfg.cache_dir if data_cfg.cache_dir is not None else default_cache_dir(data_cfg.path)
        arrays = fill_behaviour_logprobs(arrays, model_path=reference_path, model=reference, cache_dir=cache_dir,
                                         batch_size=data_cfg.behaviour_batch_size, report=loaded.report,
                                         packing=data_cfg.packing)
    return arrays, loaded.report
