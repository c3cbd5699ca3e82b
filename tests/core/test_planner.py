"""Planner: one-at-a-time and pairwise expansion, aliases, stable case ids, the 256 cap."""

from __future__ import annotations

import copy
import json
from itertools import islice

import pytest

from xconf import planner
from xconf.config.strict import parse_experiment
from xconf.contract.loader import load_contract, parse_contract
from xconf.errors import PlanError
from xconf.knobs import KnobValue
from xconf.planner import MAX_CASES, plan_experiment


def plan(doc):
    return plan_experiment(parse_experiment(doc))


def ids(doc) -> list[str]:
    return [c.case_id for c in plan(doc).cases]


def issue_codes(doc) -> list[tuple[str, str]]:
    with pytest.raises(PlanError) as info:
        plan(doc)
    return [(i.code, i.path) for i in info.value.issues]


# -- one at a time ---------------------------------------------------------------------------


def test_s0_example_is_baseline_plus_one_case_per_value(s0_doc) -> None:
    cases = plan(s0_doc).cases
    assert len(cases) == 1 + 2 + 1 + 1 + 1 + 1 + 3
    assert cases[0].kind == "baseline" and cases[0].changed == ()
    assert all(c.kind == "one_at_a_time" and len(c.changed) == 1 for c in cases[1:])
    assert [c.index for c in cases] == list(range(len(cases)))


def test_s3_example_plans_eleven_cases(s3_doc) -> None:
    cases = plan(s3_doc).cases
    assert len(cases) == 11
    changed = [dict(c.changed) for c in cases[1:]]
    assert {"logp.backend": "xconf.reference_logp"} in changed
    assert {"training.sharding": "unsharded"} in changed


def test_each_case_changes_exactly_one_knob_from_the_baseline(s0_doc) -> None:
    result = plan(s0_doc)
    baseline = result.cases[0].knob_dict()
    for case in result.cases[1:]:
        knobs = case.knob_dict()
        differing = {k for k in knobs if knobs[k] != baseline[k]}
        assert differing == set(dict(case.changed))


@pytest.mark.parametrize(
    ("path", "values", "added"),
    [
        ("batch.size", [2], 0),
        ("batch.size", [2, 1], 1),
        ("rollout.dtype", ["fp32", "float32", "bf16"], None),  # duplicates: refused
        ("rollout.dtype", ["FP32"], 0),
        ("training.attention_backend", ["sdpa"], 0),
        ("logp.backend", ["native", "auto"], None),  # auto == native: a duplicate
        ("logp.backend", ["default"], 0),
        ("rollout.enforce_eager", [True], 0),
        ("training.sharding", ["none", "single"], None),  # both mean unsharded
    ],
)
def test_values_equal_to_the_baseline_add_no_case(s0_doc, path, values, added) -> None:
    s0_doc["interventions"] = [{"path": path, "values": values}]
    if added is None:
        assert ("plan.duplicate_value", "interventions[0].values[1]") in issue_codes(s0_doc)
        return
    assert len(plan(s0_doc).cases) == 1 + added


@pytest.mark.parametrize(
    ("path", "alias", "canonical"),
    [
        ("rollout.dtype", "bf16", "bfloat16"),
        ("rollout.dtype", "torch.bfloat16", "bfloat16"),
        ("training.compute_dtype", "fp16", "float16"),
        ("training.compute_dtype", "half", "float16"),
        ("training.attention_backend", "fa2", "flash_attention_2"),
        ("training.attention_backend", "auto", "native"),
        ("training.attention_backend", "default", "native"),
        ("training.sharding", "fsdp2", "fsdp"),
        ("logp.backend", "rlkernel.reference_logp", "xconf.reference_logp"),
        ("logp.backend", " RLKernel.Reference_LogP ", "xconf.reference_logp"),
    ],
)
def test_aliases_normalize_to_the_same_case_id(s0_doc, path, alias, canonical) -> None:
    s0_doc["interventions"] = [{"path": path, "values": [alias]}]
    with_alias = plan(s0_doc).cases
    s0_doc["interventions"] = [{"path": path, "values": [canonical]}]
    with_canonical = plan(s0_doc).cases
    assert dict(with_alias[-1].changed) == {path: canonical}
    assert [c.case_id for c in with_alias] == [c.case_id for c in with_canonical]


def test_fp32_baseline_alias_gives_the_same_ids(s0_doc) -> None:
    reference = ids(s0_doc)
    s0_doc["baseline"]["rollout"]["dtype"] = "fp32"
    s0_doc["baseline"]["training"]["compute_dtype"] = "FLOAT"
    assert ids(s0_doc) == reference
    assert plan(s0_doc).spec.baseline_dict()["rollout.dtype"] == "float32"


# -- case ids --------------------------------------------------------------------------------


def test_case_ids_are_stable_golden_values(s0_doc, s3_doc) -> None:
    # Golden ids: a change here changes every artifact path and breaks resume of old runs.
    assert ids(s0_doc)[0] == "c-5fcd053820181cc6"
    assert ids(s3_doc)[0] == "c-daed179b9c728eaf"


def test_case_ids_are_unique_and_safe(s0_doc) -> None:
    case_ids = ids(s0_doc)
    assert len(set(case_ids)) == len(case_ids)
    assert all(c.startswith("c-") and len(c) == 18 for c in case_ids)


def test_case_ids_do_not_depend_on_intervention_order(s0_doc) -> None:
    forward = plan(s0_doc).cases
    s0_doc["interventions"].reverse()
    for item in s0_doc["interventions"]:
        item["values"].reverse()
    backward = plan(s0_doc).cases
    assert backward[0].case_id == forward[0].case_id
    assert {c.case_id: c.changed for c in backward} == {c.case_id: c.changed for c in forward}


def test_case_ids_do_not_depend_on_key_order(s0_doc) -> None:
    shuffled = json.loads(json.dumps(s0_doc, sort_keys=True))
    shuffled["baseline"] = dict(reversed(list(shuffled["baseline"].items())))
    assert ids(shuffled) == ids(s0_doc)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["identity"]["token_ids"][0].__setitem__(0, 3),
        lambda d: d["identity"].__setitem__("checkpoint_id", "other"),
        lambda d: d["identity"].__setitem__("scoring_mode", "prefill"),
        lambda d: d["scenario"].__setitem__("description", "other"),
        lambda d: d.__setitem__("scenario_id", "other"),
    ],
    ids=["token", "checkpoint", "scoring-mode", "scenario", "scenario-id"],
)
def test_case_ids_hash_identity_and_scenario(s0_doc, change) -> None:
    before = set(ids(s0_doc))
    change(s0_doc)
    assert before.isdisjoint(ids(s0_doc))


def test_case_ids_hash_the_contract(s0_doc) -> None:
    spec = parse_experiment(s0_doc)
    shipped = plan_experiment(spec)
    document = json.loads(json.dumps(_contract_document()))
    document["selected_logprob"]["absolute_threshold"]["float32"] = 2e-5
    other = plan_experiment(spec, parse_contract(document))
    assert {c.case_id for c in shipped.cases}.isdisjoint(c.case_id for c in other.cases)
    assert shipped.contract_sha256 == load_contract().sha256
    assert shipped.contract_version == load_contract().version


def _contract_document():
    from importlib import resources

    text = resources.files("xconf.contract").joinpath("numerical_contract.json").read_text()
    return json.loads(text)


def test_explicit_operator_mapping_is_part_of_the_case_id(s0_doc) -> None:
    s0_doc["interventions"] = [{"path": "batch.size", "values": [1]}]
    plain = ids(s0_doc)
    s0_doc["operators"] = {"selected_logprob": {"training": "xconf.reference_logp"}}
    assert set(plain).isdisjoint(ids(s0_doc))


# -- pairwise --------------------------------------------------------------------------------


def _pairwise(doc, pairs):
    doc["strategy"] = "pairwise"
    doc["interventions"] = [
        {"path": "batch.size", "values": [1, 4]},
        {"path": "rollout.dtype", "values": ["bf16"]},
        {"path": "training.attention_backend", "values": ["eager", "sdpa"]},  # sdpa = baseline
        {"path": "rollout.enforce_eager", "values": [False]},
    ]
    doc["pairwise_paths"] = pairs
    return doc


def test_pairwise_expands_only_declared_pairs(s0_doc) -> None:
    cases = plan(_pairwise(s0_doc, [["batch.size", "rollout.dtype"]])).cases
    oat = [c for c in cases if c.kind == "one_at_a_time"]
    pairs = [c for c in cases if c.kind == "pairwise"]
    assert len(oat) == 2 + 1 + 1 + 1
    assert sorted(dict(c.changed)["batch.size"] for c in pairs) == [1, 4]
    assert all(dict(c.changed)["rollout.dtype"] == "bfloat16" for c in pairs)
    assert len(cases) == 1 + 5 + 2  # no Cartesian product over all four paths


def test_pairwise_product_within_each_pair(s0_doc) -> None:
    doc = _pairwise(
        s0_doc,
        [["batch.size", "training.attention_backend"], ["rollout.dtype", "rollout.enforce_eager"]],
    )
    pairs = [dict(c.changed) for c in plan(doc).cases if c.kind == "pairwise"]
    assert len(pairs) == 2 * 1 + 1 * 1
    assert all(len(p) == 2 for p in pairs)
    assert {"rollout.dtype": "bfloat16", "rollout.enforce_eager": False} in pairs


def test_pair_order_does_not_change_case_ids(s0_doc) -> None:
    a = ids(_pairwise(copy.deepcopy(s0_doc), [["batch.size", "rollout.dtype"]]))
    b = ids(_pairwise(s0_doc, [["rollout.dtype", "batch.size"]]))
    assert set(a) == set(b)


@pytest.mark.parametrize(
    ("strategy", "pairs", "code", "path"),
    [
        ("one_at_a_time", [["batch.size", "rollout.dtype"]], "plan.pairwise_not_enabled", None),
        ("pairwise", [], "plan.pairwise_paths_required", "pairwise_paths"),
        ("pairwise", [["batch.size", "batch.size"]], "plan.invalid_pair", "pairwise_paths[0]"),
        (
            "pairwise",
            [["batch.size", "training.compute_dtype"]],
            "plan.undeclared_pair_path",
            "pairwise_paths[0]",
        ),
        (
            "pairwise",
            [["batch.size", "rollout.dtype"], ["rollout.dtype", "batch.size"]],
            "plan.duplicate_pair",
            "pairwise_paths[1]",
        ),
    ],
)
def test_pairwise_issue_codes(s0_doc, strategy, pairs, code, path) -> None:
    doc = _pairwise(s0_doc, pairs)
    doc["strategy"] = strategy
    found = issue_codes(doc)
    assert code in [c for c, _ in found]
    if path:
        assert (code, path) in found


# -- the cap ---------------------------------------------------------------------------------


def _sizes(count: int) -> list[int]:
    return [v for v in range(1, count + 2) if v != 2][:count]  # 2 is the baseline value


def test_exactly_256_cases_is_allowed(s0_doc) -> None:
    s0_doc["interventions"] = [{"path": "batch.size", "values": _sizes(MAX_CASES - 1)}]
    assert len(plan(s0_doc).cases) == MAX_CASES == 256


def test_257_cases_is_refused(s0_doc) -> None:
    s0_doc["interventions"] = [{"path": "batch.size", "values": _sizes(MAX_CASES)}]
    assert issue_codes(s0_doc) == [("plan.too_large", "interventions")]


def test_pairwise_expansion_is_capped(s0_doc) -> None:
    s0_doc["strategy"] = "pairwise"
    s0_doc["interventions"] = [
        {"path": "batch.size", "values": _sizes(16)},
        {"path": "rollout.tensor_parallel_size", "values": _sizes(16)},
    ]
    s0_doc["pairwise_paths"] = [["batch.size", "rollout.tensor_parallel_size"]]
    assert [c for c, _ in issue_codes(s0_doc)] == ["plan.too_large"]


def test_cap_is_checked_before_accumulation(s0_doc, monkeypatch) -> None:
    pulled = 0
    original = planner._expand

    def endless(baseline, declared, pairs):
        nonlocal pulled
        size = 1
        for item in original(baseline, declared, pairs):
            pulled += 1
            yield item
        while pulled < 10_000:  # a planner that accumulates first would pull all of these
            pulled += 1
            size += 1
            yield "one_at_a_time", (("batch.size", size + 1000),)

    monkeypatch.setattr(planner, "_expand", endless)
    s0_doc["interventions"] = []
    assert [c for c, _ in issue_codes(s0_doc)] == ["plan.too_large"]
    assert pulled == MAX_CASES + 1


def test_the_cap_is_not_configurable(s0_doc) -> None:
    s0_doc["max_cases"] = 10_000
    from xconf.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_experiment(s0_doc)
    assert info.value.code == "config.unknown_key"


def test_expansion_is_lazy() -> None:
    baseline: dict[str, KnobValue] = {"batch.size": 2}
    declared: dict[str, list[KnobValue]] = {"batch.size": list(range(10))}
    first = list(islice(planner._expand(baseline, declared, []), 2))
    assert first[0] == ("baseline", ())


# -- planning builds no engine ---------------------------------------------------------------


def test_planning_never_constructs_an_engine(s0_doc, monkeypatch, tmp_path) -> None:
    from xconf.adapters.cpu_smoke import engines
    from xconf.session import prepare, publish_plan

    def boom(*args, **kwargs):
        raise AssertionError("planning constructed an engine")

    monkeypatch.setattr(engines._SyntheticEngine, "__init__", boom)
    monkeypatch.setattr(engines, "build_model", boom)
    prepared = prepare(
        parse_experiment(s0_doc), output_root=tmp_path, allow_smoke_operators=True, device="cpu"
    )
    publish_plan(prepared)
    assert len(prepared.execution.cases) == 10


def test_plan_records_are_immutable(s0_doc) -> None:
    case = plan(s0_doc).cases[0]
    with pytest.raises(AttributeError):
        case.case_id = "c-x"  # type: ignore[misc]
