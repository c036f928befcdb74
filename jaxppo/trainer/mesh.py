"""The device mesh of a run, from its config's ``mesh`` section (every entry point builds it the same way)."""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import Mesh

from jaxppo.config import ConfigError
from jaxppo.parallel import make_mesh, merged_rules


def check_mesh_size(mesh_cfg, n_devices: int, *, exact: bool = True) -> int:
    """The mesh's device count ``mesh.data x mesh.fsdp x mesh.tensor``; ConfigError when it differs from the
    ``n_devices`` available (``exact``) or exceeds them (not ``exact``: the mesh takes the first devices)."""
    m = mesh_cfg
    n = m.data * m.fsdp * m.tensor
    if exact and n != n_devices:
        raise ConfigError(f"mesh: data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} = {n} devices, but "
                          f"{n_devices} are available; set mesh.data/fsdp/tensor so their product is {n_devices}")
    if n > n_devices:
        raise ConfigError(f"mesh: data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} = {n} devices, but only "
                          f"{n_devices} are available")
    return n


def mesh_from_config(mesh_cfg, devices: Sequence[jax.Device]) -> tuple[Mesh, dict]:
    """The ``Mesh`` of a config's ``mesh`` section over ``devices`` (exactly ``data x fsdp x tensor`` of them) and its
    sharding rules (``parallel.DEFAULT_RULES`` with ``mesh.rules`` over them); a rule naming an unknown mesh axis is a
    ``ConfigError``. What train, DPO, evaluation and the plan build before loading a model."""
    mesh = make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor, devices=devices)
    try:
        rules = merged_rules(mesh_cfg.rules)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return mesh, rules
