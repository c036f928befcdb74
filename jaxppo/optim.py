"""The optimizer factory and the state helpers every trainer shares (PPO, DPO, the reward model), below them all.

Optimizers: ``clip_by_global_norm(grad_clip) -> adamw(learning_rate)`` with the learning rate an
injected hyper-parameter (``optax.inject_hyperparams``) held in the optimizer state. A train step sets
it with :func:`set_learning_rate` to ``lr_schedule(state.step)`` before its updates, so the schedule
advances once per train step, not once per optimizer update (PPO's ``ppo_epochs`` updates per step all use
the same LR; optax's own update count would run the schedule ``ppo_epochs`` times too fast). The
schedule is a linear warmup from 0 to ``lr`` over ``warmup_steps`` then ``constant`` / ``cosine`` /
``linear`` decay to ``min_lr_ratio·lr`` at ``total_steps``::

    lr(t) = lr · t / warmup                                       t < warmup
    cosine: lr(t) = end + (lr − end) · ½ (1 + cos(π (t − warmup) / (total − warmup)))   (end = min_lr_ratio · lr)

``state.step`` counts every step call, NaN-skipped ones included, so a skipped step uses up one schedule step.
The guards' LR cut ``lr_scale`` multiplies the injected learning rate (adamw's update is ``-lr·(adam + wd·θ)``:
the weight decay scales with it exactly as with a schedule).

Low-precision parameters (``model.param_dtype: bfloat16``) get a float32 master copy (:func:`with_master_weights`,
applied by :func:`make_optimizer` when ``params`` has a 16-bit floating leaf): the optimizer keeps
``θ32`` in its state, runs clipping and AdamW in float32 on it, and returns the update that makes the stored
parameter ``θ16 = round16(θ32)``, so updates smaller than half a bf16 ulp of a weight accumulate instead of
being lost::

    θ32' = θ32 + adamw(clip(g32))          u = round16(θ32') − θ16   (in float32)
    apply_updates(θ16, u) = round16(θ16 + u) = round16(θ32')
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxppo.models.layers import is_low_precision


def lr_schedule(optim_cfg, total_steps: int) -> optax.Schedule:
    """Warmup (linear 0→lr) then constant/cosine/linear decay to ``min_lr_ratio·lr`` at ``total_steps``."""
    lr, warm = float(optim_cfg.lr), int(optim_cfg.warmup_steps)
    end = lr * float(optim_cfg.min_lr_ratio)
    decay_steps = max(int(total_steps) - warm, 1)
    if optim_cfg.schedule == "constant":
        main = optax.constant_schedule(lr)
    elif optim_cfg.schedule == "cosine":
        main = optax.cosine_decay_schedule(lr, decay_steps, alpha=optim_cfg.min_lr_ratio)
    else:
        main = optax.linear_schedule(lr, end, decay_steps)
    if warm == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), main], [warm])


def make_optimizer(optim_cfg, total_steps: int, params=None) -> optax.GradientTransformation:
    """``clip_by_global_norm → adamw`` whose ``learning_rate`` lives in the optimizer state (initialised to
    ``lr_schedule(0)``; the train step sets it per step with :func:`set_learning_rate`). ``total_steps`` is
    only used for that initial value. ``params`` (arrays or ``ShapeDtypeStruct``s): when any floating leaf is
    16-bit, the chain runs on a float32 master copy (:func:`with_master_weights`)."""
    b1, b2 = optim_cfg.betas
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("b1", "b2", "eps", "eps_root", "weight_decay",
                                                               "mu_dtype", "mask", "nesterov"))
    lr0 = float(lr_schedule(optim_cfg, total_steps)(0))
    tx = optax.chain(optax.clip_by_global_norm(float(optim_cfg.grad_clip)),
                     adamw(learning_rate=lr0, b1=float(b1), b2=float(b2), eps=float(optim_cfg.eps),
                           weight_decay=float(optim_cfg.weight_decay)))
    return with_master_weights(tx) if params is not None and has_low_precision(params) else tx


def has_low_precision(params) -> bool:
    """Whether any floating leaf of ``params`` is narrower than float32 (bfloat16 / float16)."""
    return any(_low(x) for x in jax.tree.leaves(params))


def _low(x) -> bool:
    return is_low_precision(x.dtype)


class MasterState(NamedTuple):
    """State of :func:`with_master_weights`: the float32 copies of the 16-bit parameters (an empty float32 array in
    place of each parameter that is already float32 or wider) and the wrapped optimizer's state."""
    master: Any
    inner: Any


def with_master_weights(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``inner`` run on float32 copies of the 16-bit parameters (see the module docstring).

    ``init`` copies each 16-bit leaf to float32 (exactly); wider leaves get no copy. ``update(g, state, params)``
    runs ``inner`` on the float32 view (master where a copy exists, the parameter otherwise) with ``g`` cast to
    float32, moves the masters, and returns for a 16-bit leaf ``round(master', dtype) − param`` in float32, so
    ``optax.apply_updates`` (which adds in float32 and rounds to the parameter's dtype) stores exactly the rounded
    master; a float32 leaf gets ``inner``'s update unchanged (bit-identical to running ``inner`` alone)."""
    f32 = jnp.float32

    def view(params, master):
        return jax.tree.map(lambda p, m: m if _low(p) else p, params, master)

    def init(params):
        master = jax.tree.map(lambda p: p.astype(f32) if _low(p) else jnp.zeros((0,), f32), params)
        return MasterState(master, inner.init(view(params, master)))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("with_master_weights: update needs the current params")
        v = view(params, state.master)
        g = jax.tree.map(lambda x: x.astype(f32) if _low(x) else x, updates)
        u, inner_state = inner.update(g, state.inner, v)
        moved = optax.apply_updates(v, u)
        master = jax.tree.map(lambda p, new, m: new if _low(p) else m, params, moved, state.master)
        out = jax.tree.map(lambda p, new, ui: new.astype(p.dtype).astype(f32) - p.astype(f32) if _low(p) else ui,
                           params, moved, u)
        return out, MasterState(master, inner_state)

    return optax.GradientTransformation(init, update)


_INJECTED = (optax.InjectStatefulHyperparamsState, optax.InjectHyperparamsState)


def set_learning_rate(opt_state, lr: jax.Array | float):
    """``opt_state`` (of :func:`make_optimizer`) with its injected ``learning_rate`` set to ``lr``."""
    found = []

    def fix(x):
        if isinstance(x, _INJECTED) and "learning_rate" in x.hyperparams:
            found.append(True)
            cur = x.hyperparams["learning_rate"]
            return x._replace(hyperparams={**x.hyperparams, "learning_rate": jnp.asarray(lr, cur.dtype)})
        return x
    out = jax.tree.map(fix, opt_state, is_leaf=lambda x: isinstance(x, _INJECTED))
    if not found:
        raise ValueError("optimizer state has no injected learning_rate (not built by make_optimizer?)")
    return out


def learning_rate_of(opt_state) -> jax.Array:
    """The injected ``learning_rate`` held in ``opt_state`` (the one its next update applies)."""
    for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, _INJECTED)):
        if isinstance(x, _INJECTED) and "learning_rate" in x.hyperparams:
            return x.hyperparams["learning_rate"]
    raise ValueError("optimizer state has no injected learning_rate (not built by make_optimizer?)")


def split_params(model) -> tuple[Any, Any]:
    """``(graphdef, params)``; every variable of our models is an ``nnx.Param``."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError(f"{type(model).__name__} has non-parameter state {list(rest.keys())}; the trainer "
                         "expects parameters only")
    return graphdef, params


def replicate_leaves(tree, mesh):
    """Put every array leaf that is not already on ``mesh`` there, replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    rep = NamedSharding(mesh, PartitionSpec())

    def put(x):
        if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh:
            return x
        return jax.device_put(x, rep)
    return jax.tree.map(put, tree)


def shardings_of(state: Any):
    """The ``NamedSharding`` of every leaf (for jit ``in_shardings`` / ``out_shardings``)."""
    return jax.tree.map(lambda x: x.sharding, state)


def param_finite(state: Any) -> bool:
    """True when every parameter of ``state.actor`` (and ``state.critic`` where the state has one) is finite
    (checked before a checkpoint is written). One jitted program, the same on every process, read with
    ``to_host`` (a global array that spans several processes cannot be read with ``bool``)."""
    from jaxppo.parallel.host import to_host

    return bool(to_host(_all_finite((state.actor, getattr(state, "critic", None)))))


def all_finite(tree) -> jax.Array:
    """A scalar bool: every element of every leaf of ``tree`` is finite (true for a tree without leaves)."""
    leaves = jax.tree.leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.bool_(True)


# one program (the same on every process) that reduces every leaf to a single replicated bool
_all_finite = jax.jit(all_finite)


def _is_abstract(tree) -> bool:
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def optimizer_shardings(tx: optax.GradientTransformation, params, mesh):
    """The ``NamedSharding`` of every leaf of ``tx.init(params)``: a leaf whose tree path ends with a parameter's
    path and has that parameter's shape (AdamW ``mu``/``nu``, any per-parameter state) gets the parameter's
    sharding; every other leaf (step counts, scalars) is replicated on ``mesh``.

    ``params`` leaves must carry their shardings (``jax.Array`` on ``mesh`` or ``ShapeDtypeStruct(sharding=...)``).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    rep = NamedSharding(mesh, PartitionSpec())
    by_path = {tuple(p): (tuple(x.shape), x.sharding) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    lengths = sorted({len(p) for p in by_path}, reverse=True)

    def pick(path, leaf):
        path = tuple(path)
        for n in lengths:
            hit = by_path.get(path[len(path) - n:]) if n <= len(path) else None
            if hit is not None and hit[0] == tuple(leaf.shape):
                return hit[1]
        return rep

    abstract = jax.eval_shape(tx.init, params)
    return jax.tree_util.tree_map_with_path(pick, abstract)


def init_optimizer(tx: optax.GradientTransformation, params, mesh):
    """``tx.init(params)`` with every optimizer leaf sharded like its parameter (``optimizer_shardings``).

    Jitted with explicit ``out_shardings``, so the moments are created directly on their shards (never
    gathered on one device). With abstract ``params`` (``ShapeDtypeStruct`` leaves with shardings) the
    result is abstract too: ``ShapeDtypeStruct`` leaves carrying those shardings, nothing allocated.
    """
    shardings = optimizer_shardings(tx, params, mesh)
    if _is_abstract(params):
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            jax.eval_shape(tx.init, params), shardings)
    return jax.jit(tx.init, out_shardings=shardings)(params)
