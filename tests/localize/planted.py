"""A tiny hf_pair (or vllm_hf) experiment with explicit frozen tokens, and a runtime that plants
a perturbation in one module of one side: real modules, a real forward hook, nothing faked."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from xconf.adapters.checkpoint.runtime import CheckpointRuntime
from xconf.adapters.frozen import FrozenBatch, FrozenSample
from xconf.case_record import RunSummary
from xconf.config.strict import parse_experiment
from xconf.localize.sides import side_module
from xconf.session import prepare, run_prepared

LAYERS = 4
SAMPLES = (
    FrozenSample((11, 42, 7, 99, 3), (250, 17, 64, 8, 301, 5)),
    FrozenSample((5, 6, 7), (480, 22, 13, 77, 2, 140, 9)),
)


def experiment(experiment_id: str, interventions: list[dict[str, Any]]) -> dict[str, Any]:
    layout = FrozenBatch(SAMPLES, 0).layout()
    return {
        "schema_version": "cross_config.experiment_config.v1",
        "experiment_id": experiment_id,
        "scenario_id": "localize-tiny",
        "contract_source": "xconf",
        "contract_version": "current",
        "strategy": "one_at_a_time",
        "strict_fallback": True,
        "identity": {
            "checkpoint_id": f"xconf-tiny-model.v1:qwen3:layers={LAYERS}",
            "model_version": "xconf-tiny-model.v1",
            "tokenizer_id": "xconf-bpe",
            "tokenizer_policy": "pre-tokenized ids; no special tokens added",
            **layout,
            "pre_update_state": "factory weights (never updated)",
            "cache_metadata": {"training_kv_cache": "forbidden"},
            "packing_metadata": {"packed": False, "pad_token_id": 0},
            "scoring_mode": "decode",
        },
        "baseline": {
            "batch": {"size": 2},
            "rollout": {
                "tensor_parallel_size": 1,
                "context_parallel_size": 1,
                "dtype": "float32",
                "enable_prefix_caching": False,
                "enforce_eager": True,
            },
            "training": {
                "attention_backend": "sdpa",
                "compute_dtype": "float32",
                "sharding": "unsharded",
            },
            "logp": {"backend": "native"},
        },
        "interventions": interventions,
        "scenario": {"level": "S1", "device": "cpu", "description": "localize test"},
    }


# The operator intervention leaves every activation as it is (localize scores natively): the
# only difference between the case and the baseline is the planted perturbation.
OPERATOR_CASE = [{"path": "logp.backend", "values": ["xconf.reference_logp"]}]


def _scale(factor: float) -> Any:
    def hook(module: Any, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):  # transformers attention: (output, weights)
            return (output[0] * factor, *output[1:])
        return output * factor

    return hook


class _Planted:
    """Mixin: scale ``module`` of ``side``'s model by ``factor`` for every non-baseline case."""

    plant: dict[str, Any] | None = None

    def build_engine(self, binding: Any, case: Any) -> Any:
        engine = super().build_engine(binding, case)  # type: ignore[misc]
        plant = self.plant
        if plant and binding.side == plant["side"] and case.case.kind != "baseline":
            module = side_module(engine, binding.side).module
            module.get_submodule(plant["module"]).register_forward_hook(_scale(plant["factor"]))
        return engine


class PlantedRuntime(_Planted, CheckpointRuntime):
    pass


# conf/runtime/<kind>.yaml's sides and kind
PAIRS: dict[str, dict[str, Any]] = {
    "hf_pair": {"rollout": "hf", "training": "hf", "kind": "hf-pair"},
    "vllm_hf": {"rollout": "vllm", "training": "hf"},
}


def runtime(
    kind: str, plant: dict[str, Any] | None, layers: int = LAYERS, arch: str = "qwen3"
) -> Any:
    pair = PAIRS["hf_pair" if kind == "hf_pair" else "vllm_hf"]
    adapter = PlantedRuntime(**pair, model={"num_hidden_layers": layers, "arch": arch})
    adapter.plant = copy.deepcopy(plant)
    return adapter


def run(doc: dict[str, Any], root: Path, adapter: Any) -> RunSummary:
    prepared = prepare(
        parse_experiment(doc), output_root=root, allow_smoke_operators=False, device="cpu"
    )
    return run_prepared(prepared, adapter, resume=True)
