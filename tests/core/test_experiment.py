"""Domain records: safe ids, canonical digests, identity records."""

from __future__ import annotations

import hashlib

import pytest

from xconf.canonical import canonical_digest, canonical_json
from xconf.config.strict import parse_experiment
from xconf.experiment import is_safe_id


@pytest.mark.parametrize("good", ["a", "cpu-smoke", "c-0123456789abcdef", "a-0001", "x.y_z-1"])
def test_safe_ids(good) -> None:
    assert is_safe_id(good)


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "a/b", "a\\b", "../a", "a..b", "-a", ".a", "a b", "é", "a" * 129]
)
def test_unsafe_ids(bad) -> None:
    assert not is_safe_id(bad)


def test_canonical_digest_ignores_key_order_only() -> None:
    assert canonical_digest({"a": 1, "b": [1, 2]}) == canonical_digest({"b": [1, 2], "a": 1})
    assert canonical_digest({"a": 1}) != canonical_digest({"a": 1.5})
    # The bytes every id and key has hashed so far: sorted keys, no spaces, ASCII escapes.
    blob = b'{"a":1,"b":[1,2],"s":"\\u00e9"}'
    assert canonical_digest({"s": "é", "b": [1, 2], "a": 1}) == hashlib.sha256(blob).hexdigest()
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")}, allow_nan=False)
    assert canonical_digest([1, 2]) != canonical_digest([2, 1])


def test_identity_digest_covers_every_field(s0_doc) -> None:
    base = parse_experiment(s0_doc).identity
    record = base.to_dict()
    assert set(record) >= {
        "checkpoint_id",
        "model_version",
        "tokenizer_id",
        "tokenizer_policy",
        "token_ids",
        "selected_token_ids",
        "active_mask",
        "attention_mask",
        "position_ids",
        "pre_update_state",
        "cache_metadata",
        "packing_metadata",
        "scoring_mode",
    }
    changes = {
        "tokenizer_policy": "other",
        "pre_update_state": "step-1",
        "cache_metadata": {"kv_cache_allowed_for": "none"},
        "packing_metadata": {"packed": True},
    }
    for key, value in changes.items():
        doc = {**s0_doc, "identity": {**s0_doc["identity"], key: value}}
        assert parse_experiment(doc).identity.digest() != base.digest(), key
    rows = [list(r) for r in s0_doc["identity"]["attention_mask"]]
    rows[0][0] = 1 - rows[0][0]
    doc = {**s0_doc, "identity": {**s0_doc["identity"], "attention_mask": rows}}
    assert parse_experiment(doc).identity.digest() != base.digest()
    assert base.num_samples == 4
