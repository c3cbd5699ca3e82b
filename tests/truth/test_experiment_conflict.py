"""One experiment id holds one frozen identity: another checkpoint digest, tokenizer or data
set under the same id is ``artifacts.experiment_conflict``, never attempts under the old name."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from tests.core.runs import only, run_doc
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.errors import ArtifactError
from xconf.experiment import Identity


class FreezesFrom(CpuSmokeRuntime):
    """Freezes the declared identity as a checkpoint-backed runtime does: the checkpoint
    digest, tokenizer and data set come from what it loads (``variant`` says which changed)."""

    def __init__(self, variant: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.variant = variant

    def freeze_identity(self, identity: Identity) -> Identity:
        if self.variant == "tokenizer":
            return replace(identity, tokenizer_id=identity.tokenizer_id + "-retrained")
        if self.variant == "dataset":
            rows = identity.token_ids
            return replace(identity, token_ids=((rows[0][0] + 1, *rows[0][1:]), *rows[1:]))
        if self.variant == "checkpoint":  # the weights' content digest changed
            return replace(identity, checkpoint_id=identity.checkpoint_id + ":sha256=feed")
        return identity


@pytest.mark.parametrize("variant", ["checkpoint", "tokenizer", "dataset"])
def test_another_frozen_identity_under_one_id_is_an_experiment_conflict(
    s0_doc, tmp_path, variant
) -> None:
    doc = only(copy.deepcopy(s0_doc))
    run_doc(doc, tmp_path, adapter=FreezesFrom())
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ArtifactError) as info:
        run_doc(copy.deepcopy(doc), tmp_path, adapter=FreezesFrom(variant))
    assert info.value.code == "artifacts.experiment_conflict"
    field = {"checkpoint": "checkpoint_id", "tokenizer": "tokenizer_id", "dataset": "token_ids"}
    assert field[variant] in info.value.message
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
    assert all(
        r.reused for r in run_doc(copy.deepcopy(doc), tmp_path, adapter=FreezesFrom()).records
    )
