"""Micro-batches and the batch axes: the one strided split every trainer uses, and the mesh check that goes with it.

A batch of ``B`` rows is placed on the mesh in contiguous blocks over the batch axes
(``jaxppo.parallel.BATCH_AXES`` = ``data × fsdp``): device ``d`` of ``D`` holds rows ``d·B/D .. (d+1)·B/D − 1``.
Gradient accumulation and chunked passes cut it into ``n`` micro-batches **strided**::

    micro-batch j = rows j, j + n, j + 2n, ...        (j = 0 .. n − 1, B/n rows each)

so with ``B/n`` a multiple of ``D`` every micro-batch takes the same share of every device's rows and each
``lax.scan`` / ``lax.map`` iteration stays spread over all devices (a contiguous split would put each
micro-batch on ``D/n`` of them). With a ``mesh`` the split arrays are constrained to keep their row axis on the
batch axes (:func:`constrain_batch`).

The mean of equal-sized micro-batch means is the full-batch mean, so the layout changes results only through the
order of floating-point sums.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo.config import ConfigError
from jaxppo.parallel import BATCH_AXES


def strided_split(x: jax.Array, n: int) -> jax.Array:
    """``[B, ...] -> [n, B/n, ...]`` with micro-batch ``j`` = rows ``j, j+n, j+2n, ...`` (module doc)."""
    b = x.shape[0]
    if n < 1 or b % n:
        raise ValueError(f"batch of {b} rows does not split into {n} equal micro-batches")
    return jnp.swapaxes(x.reshape(b // n, n, *x.shape[1:]), 0, 1)


def strided_merge(y: jax.Array) -> jax.Array:
    """Inverse of :func:`strided_split`: ``[n, B/n, ...] -> [B, ...]`` in the original row order."""
    return jnp.swapaxes(y, 0, 1).reshape(y.shape[0] * y.shape[1], *y.shape[2:])


def constrain_batch(x: jax.Array, mesh: Any, axis: int = 0) -> jax.Array:
    """``x`` with dimension ``axis`` split over the mesh's batch axes, the others replicated (values unchanged;
    ``mesh=None``: ``x`` itself)."""
    if mesh is None:
        return x
    spec: list[Any] = [None] * x.ndim
    spec[axis] = BATCH_AXES
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))


def split_micro(tree: Any, n: int, mesh: Any = None) -> Any:
    """Every ``[B, ...]`` leaf of ``tree`` as ``[n, B/n, ...]`` (:func:`strided_split`), rows kept on the batch axes."""
    return jax.tree.map(lambda x: constrain_batch(strided_split(x, n), mesh, axis=1), tree)


def micro_grads(grad_fn: Callable, params: Any, args: tuple, n_micro: int, mesh: Any = None,
                key: jax.Array | None = None) -> tuple[Any, Any]:
    """Gradient accumulation: ``(mean_j g_j, aux stacked [n_micro, ...])`` of ``(g_j, aux_j) = grad_fn(params, *args_j)``
    over the strided micro-batches ``args_j`` of every ``[B, ...]`` leaf of ``args`` (``lax.scan``)::

        g = (1/n) Σ_j g_j                      (= the full-batch gradient of a mean loss, micro-batches being equal)

    ``n_micro == 1``: one call on the whole batch, ``aux`` leaves get a leading axis of 1. Per-row outputs in ``aux``
    come back ``[n, B/n, ...]``; :func:`strided_merge` puts them back in row order. ``key`` (adapter dropout): micro-batch
    ``j`` gets ``fold_in(key, j)`` as a last argument, ``grad_fn(params, *args_j, key_j)``."""
    if n_micro == 1:
        g, aux = grad_fn(params, *args, *(() if key is None else (jax.random.fold_in(key, 0),)))
        return g, jax.tree.map(lambda a: a[None], aux)
    xs = split_micro(args, n_micro, mesh)

    def body(acc, x):
        x, extra = (x, ()) if key is None else (x[0], (jax.random.fold_in(key, x[1]),))
        x = jax.tree.map(lambda y: constrain_batch(y, mesh, axis=0), x)
        g, aux = grad_fn(params, *x, *extra)
        return jax.tree.map(jnp.add, acc, g), aux

    gsum, aux = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params),
                             xs if key is None else (xs, jnp.arange(n_micro)))
    return jax.tree.map(lambda g: g / n_micro, gsum), aux


def chunked_map(fn: Callable, xs: Any, chunk: int, mesh: Any = None, *, group_size: int = 1,
                aligned: Any = None) -> Any:
    """``fn`` over ``xs`` (a pytree of ``[N, ...]`` arrays) in ``chunk``-row pieces with ``lax.map``; the pieces are
    the strided micro-batches of ``N / chunk`` (module doc) and the per-row outputs come back in row order.

    ``group_size = n > 1``: the rows are whole groups of ``n`` consecutive rows, and every piece gets whole groups,
    each as ``n`` consecutive rows (the rows reordered by :func:`group_micro_order` before the split, the outputs
    put back in row order after), so ``fn`` may treat a piece's rows ``k·n .. k·n+n−1`` as one group.

    ``aligned`` (optional pytree, e.g. a packed plan): arrays already laid out for the strided split, of any leading
    size divisible by the number of pieces; split but not reordered, and ``fn`` is called ``fn((piece, aligned_j))``."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if chunk < 1 or n % chunk:
        raise ValueError(f"{n} rows are not a multiple of the chunk {chunk}")
    perm = group_micro_order(n, group_size, n // chunk)
    if perm is not None:
        xs = jax.tree.map(lambda v: v[perm], xs)
    parts = split_micro(xs, n // chunk, mesh)
    if aligned is not None:
        parts = (parts, split_micro(aligned, n // chunk, mesh))
    out = jax.lax.map(lambda part: fn(jax.tree.map(lambda v: constrain_batch(v, mesh, axis=0), part)), parts)
    out = jax.tree.map(strided_merge, out)
    if perm is not None:
        inv = np.argsort(perm)
        out = jax.tree.map(lambda v: v[inv], out)
    return out


def group_micro_order(batch: int, group_size: int, n_micro: int) -> np.ndarray | None:
    """Row order that keeps whole groups inside every strided micro-batch (``jaxppo.trainer.micro``): for rows
    ``[G, n]`` in group order (``n`` = ``group_size``, ``G = batch/n`` groups), position ``(q·n + s)·k + j`` gets
    row ``s`` of group ``q·k + j`` (``k = n_micro``), so micro-batch ``j`` (positions ``j, j+k, ...``) is groups
    ``j, j+k, j+2k, ...``, each as ``n`` consecutive rows. ``None`` when no reordering is needed (``n = 1`` or
    ``k = 1``)."""
    if group_size == 1 or n_micro == 1:
        return None
    g = batch // group_size
    if batch % group_size or g % n_micro:
        raise ValueError(f"group_micro_order: {batch} rows in groups of {group_size} do not split into {n_micro} "
                         "micro-batches of whole groups")
    rows = np.arange(batch).reshape(g // n_micro, n_micro, group_size)
    return np.ascontiguousarray(rows.transpose(0, 2, 1)).reshape(-1)


def check_mesh(mesh_cfg: Any, n_devices: int, micro_batch: int, micro_batch_key: str) -> None:
    """The mesh checks of every trainer (ConfigError naming the key): ``mesh.data x mesh.fsdp x mesh.tensor`` must
    equal ``n_devices`` and the micro-batch (``micro_batch``, set by ``micro_batch_key``) must be a multiple of the
    batch shards ``mesh.data x mesh.fsdp`` (so every strided micro-batch spreads over all of them)."""
    from jaxppo.trainer.mesh import check_mesh_size

    m = mesh_cfg
    check_mesh_size(m, n_devices)
    shards = m.data * m.fsdp
    if micro_batch % shards:
        raise ConfigError(f"{micro_batch_key}={micro_batch} must be a multiple of the mesh batch shards "
                          f"mesh.data x mesh.fsdp = {shards}")


__all__ = ["check_mesh", "chunked_map", "constrain_batch", "group_micro_order", "micro_grads", "split_micro", "strided_merge",
           "strided_split"]
