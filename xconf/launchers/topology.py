"""Derive a case's process topology (world size) from its process-lifecycle knobs.

World size is derived and recorded, never set: ``rollout.tensor_parallel_size``,
``rollout.context_parallel_size`` and ``training.sharding`` are the knobs that take effect at
process lifecycle (``KNOBS[path].lifecycle == "process"``), so they alone fix it. The
per-side rule lives in :func:`xconf.knobs.side_worlds` (each side's group is fixed by its
own knobs); the launcher starts enough ranks for the larger side and each side runs on a
sub-group of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from xconf.knobs import (
    ROLLOUT_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    TRAINING_SHARDING,
    TRAINING_TENSOR_PARALLEL_SIZE,
    KnobValueError,
    SideWorlds,
    side_worlds,
)
from xconf.launchers.errors import TopologyError

# Keys a user might reach for to pick the world size directly; the world is derived instead.
_FORBIDDEN_KEYS = frozenset({"world_size", "nproc_per_node", "nnodes", "num_ranks"})


def _as_container(cfg: DictConfig | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(cfg, DictConfig):
        # Resolve so interpolated knob values count; hydra-only interpolations must already be
        # resolved by the caller (the launcher composes and resolves in the parent).
        out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        if not isinstance(out, dict):
            raise TopologyError("launch.topology.not_a_mapping", "config is not a mapping", "")
        return {str(k): v for k, v in out.items()}
    return cfg


def _lookup(cfg: Mapping[str, Any], path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _positive_int(cfg: Mapping[str, Any], path: str) -> int:
    value = _lookup(cfg, path)
    if value is None:
        return 1
    # bool is an int subclass; `true` is never a parallel size.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(
            "launch.topology.bad_parallel_size",
            f"expected a positive integer, got {value!r}",
            path,
        )
    return value


def _reject_world_size_keys(node: Any, prefix: str) -> None:
    if isinstance(node, Mapping):
        for key, child in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key in _FORBIDDEN_KEYS:
                raise TopologyError(
                    "launch.topology.world_size_not_settable",
                    "the world size is derived from rollout/training knobs and cannot be set",
                    path,
                )
            _reject_world_size_keys(child, path)
    elif isinstance(node, list):
        for i, child in enumerate(node):
            _reject_world_size_keys(child, f"{prefix}[{i}]")


def required_world_size(cfg: DictConfig | Mapping[str, Any]) -> int:
    """Ranks a case launches: the larger side of :func:`xconf.knobs.side_worlds`; default 1.

    ``cfg`` is the job's composed config without the ``hydra`` node (or a plain mapping).
    Missing knobs count as 1 / no sharding. A key that tries to set the world size, or a
    knob with a nonsensical value, raises :class:`TopologyError` naming its path.
    """
    data = _as_container(cfg)
    _reject_world_size_keys({k: v for k, v in data.items() if k != "hydra"}, "")
    rollout = _positive_int(data, ROLLOUT_TENSOR_PARALLEL_SIZE.path) * _positive_int(
        data, ROLLOUT_CONTEXT_PARALLEL_SIZE.path
    )
    sharding = _lookup(data, TRAINING_SHARDING.path)
    if sharding is not None and not isinstance(sharding, str):
        raise TopologyError(
            "launch.topology.bad_sharding",
            f"expected a string, got {sharding!r}",
            TRAINING_SHARDING.path,
        )
    # The training side's world is its sharding's times its tensor-parallel size (Megatron).
    training_tp = _positive_int(data, TRAINING_TENSOR_PARALLEL_SIZE.path)
    try:
        worlds = side_worlds(
            {TRAINING_SHARDING.path: sharding, TRAINING_TENSOR_PARALLEL_SIZE.path: training_tp}
        )
    except KnobValueError as exc:
        raise TopologyError(
            "launch.topology.bad_sharding", str(exc), TRAINING_SHARDING.path
        ) from exc
    return SideWorlds(rollout=rollout, training=worlds.training).launched
