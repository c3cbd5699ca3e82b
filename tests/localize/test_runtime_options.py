"""Localize rebuilds the run's adapter with the options the run's adapter was built with
(actual.json's provenance), never code a run directory names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.conftest import needs_hf
from xconf.localize.errors import LocalizeError
from xconf.localize.replay import runtime_for
from xconf.runtime.loading import instantiate_runtime, runtime_config
from xconf.runtime.provenance import runtime_identity

pytestmark = needs_hf
CHECKPOINT = "xconf.adapters.checkpoint.runtime:CheckpointRuntime"
VLLM_HF = {"rollout": "vllm", "training": "hf"}


def test_a_config_built_adapter_records_every_option_and_is_rebuilt_from_them(
    tmp_path: Path,
) -> None:
    from tests.adapters.archs import write_checkpoint

    checkpoint = write_checkpoint("llama", tmp_path / "llama")
    built = instantiate_runtime(
        runtime_config("vllm_hf", [f"runtime.model.path={checkpoint}", "runtime.seed=3"])
    )
    recorded = runtime_identity(built)
    assert recorded["options"]["model"] == {"path": str(checkpoint)}
    assert recorded["options"]["seed"] == 3
    again = runtime_for("vllm-hf", recorded)
    assert again.model_options.path == str(checkpoint) and again.engine_options["seed"] == 3
    assert runtime_identity(again) == recorded


def test_recorded_options_never_change_the_class() -> None:
    recorded = {"target": "os:system", "options": {"device": "cpu"}}
    with pytest.raises(LocalizeError) as err:
        runtime_for("vllm_hf", recorded)
    assert err.value.code == "localize.runtime_mismatch"
    # `--runtime hf_pair` on a vllm_hf run: the chosen config alone
    vllm_hf = {"target": CHECKPOINT, "options": {**VLLM_HF, "seed": 5}}
    chosen = runtime_for("hf_pair", vllm_hf, chosen=True)
    assert chosen.runtime_kind == "hf-pair" and chosen.engine_options["seed"] == 0
    # the same class, other sides: not the run's runtime
    with pytest.raises(LocalizeError) as err:
        runtime_for("hf_pair", vllm_hf)
    assert err.value.code == "localize.runtime_mismatch" and "rollout=vllm" in err.value.message


def test_a_run_that_trusted_remote_code_is_refused() -> None:
    recorded = {"target": CHECKPOINT, "options": {**VLLM_HF, "trust_remote_code": True}}
    with pytest.raises(LocalizeError) as err:
        runtime_for("vllm_hf", recorded)
    assert err.value.code == "localize.remote_code"
