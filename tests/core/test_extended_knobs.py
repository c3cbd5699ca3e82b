"""The extended knobs (beyond the drift contract): v1 keeps the contract's allowlist, v2 and
Hydra take more; the vllm_hf runtime's materialization of each is truthful (pure: no engine
is built)."""

from __future__ import annotations

import pytest

from xconf.adapters.checkpoint.runtime import CheckpointRuntime
from xconf.config.strict import parse_experiment
from xconf.errors import ConfigError, PlanError
from xconf.experiment import EXPERIMENT_SCHEMA_V2
from xconf.knobs import CONTRACT_KNOBS, EXTENDED_KNOBS, KNOBS
from xconf.planner import plan_experiment
from xconf.runtime.materialization import materialize

NEW_KNOBS = {
    "rollout.kv_cache_dtype": "engine_construction",
    "rollout.enable_chunked_prefill": "engine_construction",
    "rollout.max_num_batched_tokens": "engine_construction",
    "rollout.batch_invariant": "engine_construction",
    "training.param_dtype": "engine_construction",
    "training.reduce_dtype": "engine_construction",
    "training.remove_padding": "engine_construction",
    "training.scoring_mode": "engine_construction",
    "rollout.scoring_mode": "engine_construction",
    "training.align.rms_norm": "engine_construction",
    "training.align.linear": "engine_construction",
    "training.align.rotary": "engine_construction",
    "training.align.attention": "engine_construction",
    "training.align.activation": "engine_construction",
    "training.align.logits": "engine_construction",
    "training.align.all": "engine_construction",
    "rollout.logits_dtype": "engine_construction",
    "training.logits_dtype": "engine_construction",
    "training.temperature": "engine_construction",
    "rollout.logprobs_mode": "engine_construction",
    "rollout.temperature": "engine_construction",
    "rollout.top_k": "engine_construction",
    "rollout.top_p": "engine_construction",
    "rollout.weight_sync": "engine_construction",
    "rollout.weight_sync_dtype": "engine_construction",
}
# Megatron's training side's own (adapters/megatron/handlers.py); vllm_hf has no handler.
MEGATRON_KNOBS = {
    "training.tensor_parallel_size": "process",
    "training.sequence_parallel": "engine_construction",
    "training.bias_activation_fusion": "engine_construction",
    "training.bias_dropout_fusion": "engine_construction",
    "training.masked_softmax_fusion": "engine_construction",
    "training.apply_rope_fusion": "engine_construction",
    "training.cross_entropy_loss_fusion": "engine_construction",
}


def test_extended_knobs_and_lifecycles() -> None:
    assert {p: KNOBS[p].lifecycle for p in EXTENDED_KNOBS} == NEW_KNOBS | MEGATRON_KNOBS
    assert CONTRACT_KNOBS.isdisjoint(EXTENDED_KNOBS)
    handlers = CheckpointRuntime("vllm", "hf").sides.handlers()
    honoured = set(handlers["rollout"]) | set(handlers["training"])
    # the vllm_hf runtime has code for every one but Megatron's
    assert honoured >= EXTENDED_KNOBS - set(MEGATRON_KNOBS)
    assert honoured.isdisjoint(MEGATRON_KNOBS)


@pytest.mark.parametrize(
    ("where", "mutate"),
    [
        (
            "baseline.rollout.kv_cache_dtype",
            lambda d: d["baseline"]["rollout"].update(kv_cache_dtype="fp8"),
        ),
        (
            "interventions[0].path",
            lambda d: d.__setitem__(
                "interventions", [{"path": "training.remove_padding", "values": [True]}]
            ),
        ),
    ],
)
def test_an_extended_knob_in_a_v1_document_is_refused(s0_doc, where, mutate) -> None:
    mutate(s0_doc)
    with pytest.raises(ConfigError) as info:
        parse_experiment(s0_doc)
    assert info.value.code == "config.extended_knob_in_v1"
    assert info.value.path == where
    assert EXPERIMENT_SCHEMA_V2 in info.value.message  # says which schema accepts it


def test_a_v2_document_and_a_hydra_document_take_them(s0_doc) -> None:
    s0_doc["baseline"]["training"]["remove_padding"] = False
    s0_doc["interventions"] = [{"path": "training.remove_padding", "values": [True]}]
    hydra_doc = {k: v for k, v in s0_doc.items() if k != "schema_version"}
    s0_doc["schema_version"] = EXPERIMENT_SCHEMA_V2
    for doc, required in ((s0_doc, True), (hydra_doc, False)):
        plan = plan_experiment(parse_experiment(doc, require_schema_version=required))
        assert [c.changed for c in plan.cases] == [(), (("training.remove_padding", True),)]


def test_a_changed_extended_knob_needs_a_baseline_value(s0_doc) -> None:
    s0_doc["schema_version"] = EXPERIMENT_SCHEMA_V2
    s0_doc["interventions"] = [{"path": "rollout.kv_cache_dtype", "values": ["fp8"]}]
    with pytest.raises(PlanError) as info:
        plan_experiment(parse_experiment(s0_doc))
    assert [(i.code, i.path) for i in info.value.issues] == [
        ("plan.missing_baseline_value", "baseline.rollout.kv_cache_dtype")
    ]


def _status(path: str, value: object, device: str = "cpu", **knobs: object) -> tuple[str, str]:
    side = "training" if path.startswith("training") else "rollout"
    runtime = CheckpointRuntime("vllm", "hf", device=device)
    handlers = runtime.sides.handlers()[side]  # type: ignore[index]
    record = materialize(handlers, runtime.view(), path, side, value, knobs)  # type: ignore[arg-type]
    return record.status, record.evidence


@pytest.mark.parametrize(
    ("path", "value", "knobs", "status", "why"),
    [
        ("rollout.kv_cache_dtype", "fp8", {}, "applied", "kv_cache_dtype=fp8"),
        ("rollout.kv_cache_dtype", "bfloat16", {}, "unsupported", "CPU attention backend"),
        ("rollout.max_num_batched_tokens", 64, {}, "applied", "max_num_batched_tokens=64"),
        ("rollout.batch_invariant", False, {}, "applied", "VLLM_BATCH_INVARIANT=0"),
        ("rollout.batch_invariant", True, {}, "unsupported", "Triton"),
        ("training.param_dtype", "bfloat16", {"training.sharding": "fsdp"}, "applied", "mp_policy"),
        (
            "training.param_dtype",
            "bfloat16",
            {"training.sharding": "unsharded"},
            "unsupported",
            "FSDP2",
        ),
        (
            "training.reduce_dtype",
            "none",
            {"training.sharding": "unsharded"},
            "applied",
            "no FSDP2",
        ),
        ("training.remove_padding", True, {}, "applied", "packed row"),
    ],
)
def test_materialization_says_what_this_machine_can_honour(path, value, knobs, status, why) -> None:
    got, evidence = _status(path, value, **knobs)
    assert got == status and why in evidence, evidence


def test_the_shipped_v2_example_plans_and_is_refused_as_v1(tmp_path) -> None:
    import json
    from pathlib import Path

    from xconf.config.strict import load_experiment_file
    from xconf.experiment import EXPERIMENT_SCHEMA_V1

    example = Path(__file__).resolve().parents[2] / "examples" / "cross_config_s2_cpu_v2.json"
    plan = plan_experiment(load_experiment_file(example))
    changed = {path for case in plan.cases for path, _ in case.changed}
    assert {"rollout.kv_cache_dtype", "training.remove_padding"} <= changed
    document = json.loads(example.read_text())
    document["schema_version"] = EXPERIMENT_SCHEMA_V1
    (tmp_path / "v1.json").write_text(json.dumps(document))
    with pytest.raises(ConfigError) as info:
        load_experiment_file(tmp_path / "v1.json")
    assert info.value.code == "config.extended_knob_in_v1"


def test_a_baseline_scoring_mode_must_agree_with_the_identity_s(s0_doc) -> None:
    """The identity declares the baseline's rollout mode (every document that sets it plans as
    before); a baseline that declares rollout.scoring_mode too must say the same, and an
    intervention scores its own case in the other mode."""
    s0_doc["schema_version"] = EXPERIMENT_SCHEMA_V2
    s0_doc["identity"]["scoring_mode"] = "decode"
    s0_doc["baseline"]["rollout"]["scoring_mode"] = "decode"
    s0_doc["interventions"] = [{"path": "rollout.scoring_mode", "values": ["prefill"]}]
    plan = plan_experiment(parse_experiment(s0_doc))
    assert [c.changed for c in plan.cases] == [(), (("rollout.scoring_mode", "prefill"),)]
    s0_doc["baseline"]["rollout"]["scoring_mode"] = "prefill"
    with pytest.raises(PlanError) as info:
        plan_experiment(parse_experiment(s0_doc))
    (issue,) = info.value.issues
    assert (issue.code, issue.path) == (
        "plan.scoring_mode_conflict",
        "baseline.rollout.scoring_mode",
    )
    assert "identity.scoring_mode is decode" in issue.message


def test_an_arm_knob_takes_yaml_s_bare_off(s0_doc) -> None:
    """YAML reads ``off`` as false: it is the trainer's own kernels, as ``"off"`` is; ``true``
    is no arm value (an arm names whose kernels run)."""
    s0_doc["schema_version"] = EXPERIMENT_SCHEMA_V2
    s0_doc["baseline"]["training"]["align"] = {"rotary": False, "all": "off"}
    s0_doc["interventions"] = [{"path": "training.align.rotary", "values": ["vllm", True]}]
    with pytest.raises(PlanError) as info:
        plan_experiment(parse_experiment(s0_doc))
    assert [(i.code, i.path) for i in info.value.issues] == [
        ("plan.wrong_value_type", "interventions[0].values[1]")
    ]
    s0_doc["interventions"] = [{"path": "training.align.rotary", "values": ["vllm", "off"]}]
    plan = plan_experiment(parse_experiment(s0_doc))
    assert dict(plan.spec.baseline)["training.align.rotary"] == "off"
    assert [c.changed for c in plan.cases] == [(), (("training.align.rotary", "vllm"),)]
