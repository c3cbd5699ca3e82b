"""The numerical contract: shipped thresholds, version, fingerprint and the mixed-dtype rule."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import pytest

from xconf.canonical import canonical_json
from xconf.contract.loader import (
    NumericalContract,
    load_contract,
    parse_contract,
)
from xconf.errors import XconfError

EXPECTED = {"float32": 1e-5, "bfloat16": 5e-2, "float16": 5e-3}


def _shipped_document() -> dict:
    text = resources.files("xconf.contract").joinpath("numerical_contract.json").read_text("utf-8")
    return json.loads(text)


def test_thresholds_are_the_reference_table() -> None:
    assert dict(load_contract().thresholds) == EXPECTED


@pytest.mark.parametrize("dtype", sorted(EXPECTED))
def test_same_dtype_uses_its_own_threshold(dtype: str) -> None:
    resolved = load_contract().threshold_for(dtype, dtype)
    assert resolved.value == EXPECTED[dtype]
    assert resolved.dtype == dtype
    assert resolved.rule == "same_dtype"


def test_version_and_sha256_match_the_canonical_json() -> None:
    contract = load_contract()
    document = _shipped_document()
    blob = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert contract.sha256 == hashlib.sha256(blob.encode()).hexdigest()
    assert contract.sha256 == hashlib.sha256(canonical_json(document).encode()).hexdigest()
    assert contract.version == document["version"]
    assert contract.identity() == {"version": contract.version, "sha256": contract.sha256}


def test_fingerprint_is_stable_and_independent_of_key_order() -> None:
    document = _shipped_document()
    reordered = json.loads(json.dumps(document, sort_keys=True))
    reversed_keys = dict(reversed(list(reordered.items())))
    assert parse_contract(reversed_keys).sha256 == load_contract().sha256
    assert parse_contract(document).sha256 == parse_contract(document).sha256


def test_fingerprint_changes_with_any_threshold() -> None:
    document = _shipped_document()
    document["selected_logprob"]["absolute_threshold"]["float32"] = 2e-5
    assert parse_contract(document).sha256 != load_contract().sha256


@pytest.mark.parametrize(
    ("rollout", "training", "dtype"),
    [
        ("float32", "bfloat16", "bfloat16"),
        ("bfloat16", "float32", "bfloat16"),
        ("float32", "float16", "float16"),
        ("float16", "float32", "float16"),
        ("float16", "bfloat16", "bfloat16"),
        ("bfloat16", "float16", "bfloat16"),
    ],
)
def test_mixed_dtypes_take_the_less_precise_threshold(
    rollout: str, training: str, dtype: str
) -> None:
    contract = load_contract()
    resolved = contract.threshold_for(rollout, training)
    assert resolved.dtype == dtype
    assert resolved.value == EXPECTED[dtype]
    assert resolved.rule == contract.mixed_dtype_rule == "less_precise_dtype"
    statement = _shipped_document()["selected_logprob"]["mixed_dtype_rule"]["statement"]
    assert "less precise" in statement


def test_unknown_dtype_is_refused_with_its_side() -> None:
    with pytest.raises(XconfError) as info:
        load_contract().threshold_for("float32", "int8")
    assert info.value.code == "contract.unknown_dtype"
    assert info.value.path == "training.dtype"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("version"),
        lambda d: d["selected_logprob"].pop("absolute_threshold"),
        lambda d: d["selected_logprob"]["mixed_dtype_rule"]["precision_order"].pop(),
        lambda d: d["selected_logprob"]["absolute_threshold"].update(float32="x"),
    ],
    ids=["no-version", "no-thresholds", "order-mismatch", "non-numeric"],
)
def test_malformed_contract_is_refused(mutate) -> None:
    document = _shipped_document()
    mutate(document)
    with pytest.raises(XconfError) as info:
        parse_contract(document)
    assert info.value.code == "contract.malformed"


def test_threshold_does_not_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XCONF_THRESHOLD", "XCONF_ATOL", "THRESHOLD", "ATOL", "RTOL"):
        monkeypatch.setenv(name, "1.0")
    load_contract.cache_clear()
    try:
        assert dict(load_contract().thresholds) == EXPECTED
    finally:
        load_contract.cache_clear()


def test_contract_is_frozen() -> None:
    contract: NumericalContract = load_contract()
    with pytest.raises(TypeError):
        contract.thresholds["float32"] = 1.0  # type: ignore[index]
