"""``rollout.weight_sync=reload`` on checkpoints made with transformers' own classes
(tests/adapters/archs.py): a vLLM engine built from the perturbed source checkpoint, then sent
the scored weights through ``reload_weights``.

A complete float32 sync holds exactly what a ``load`` engine holds (its scores are bit for
bit a load engine's) and reads back ``reload``; a bfloat16 transport reads back its dtype and
says it was lossy; a sync that withholds one tensor (a planted stale parameter) reads back
what the engine holds, naming it (a fallback), never ``reload``. Gemma2 ties its embeddings
(vLLM's Gemma2 has no lm_head of its own): the tie is synced too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import random_batch, write_checkpoint
from tests.adapters.conftest import needs_vllm
from xconf.runtime.protocol import ReadbackFailure

pytestmark = needs_vllm

WITHHELD = "model.layers.1.mlp.down_proj.weight"


def _batch() -> Any:
    return random_batch(3, ((5, 6), (9, 6)))


def _run(path: Path, **kw: Any) -> dict[str, Any]:
    from xconf.adapters.vllm import reads
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.scorer import score_frozen

    with VllmRolloutEngine(RolloutEngineConfig(model_path=str(path), **kw)) as engine:
        live = engine.live()
        return {
            "scores": score_frozen(engine, _batch(), "decode", 2),
            "sync": live.weight_sync,
            "knob": reads.weight_sync(live),
            "dtype": reads.weight_sync_dtype(live),
            "readings": live.readings(),
        }


@pytest.fixture(scope="module", params=["llama", "gemma2"])
def synced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_checkpoint(request.param, tmp_path_factory.mktemp("sync") / request.param)
    return {
        "load": _run(path),
        "float32": _run(path, weight_sync="reload"),
        "bfloat16": _run(path, weight_sync="reload", weight_sync_dtype="bfloat16"),
        "stale": _run(path, weight_sync="reload", weight_sync_withhold=(WITHHELD,)),
    }


def test_a_float32_sync_holds_and_scores_exactly_what_a_load_holds(synced: Any) -> None:
    import torch

    load, sync = synced["load"], synced["float32"]
    assert load["sync"] is None and load["knob"] == "load" and load["dtype"] == "float32"
    record = sync["sync"]
    assert record.stale == () and record.live_digest == record.reference_digest
    assert sync["knob"] == "reload" and sync["dtype"] == "float32" and record.lossless
    assert torch.equal(sync["scores"], load["scores"])  # bitwise: the same weights
    assert sync["readings"]["rollout.weight_sync_source"].startswith("xconf-perturb/1 seed=0")


def test_the_source_checkpoint_differs_so_the_sync_is_what_made_it_equal(tmp_path: Path) -> None:
    import torch

    from xconf.adapters.vllm.weight_sync import _scored_tensors, prepare

    path = write_checkpoint("llama", tmp_path / "llama")
    import shutil

    files, again = prepare(str(path), "float32"), prepare(str(path), "float32")
    try:
        scored, source = _scored_tensors(str(path)), _scored_tensors(str(files.source))
        assert scored.keys() == source.keys()
        assert all(not torch.equal(scored[n], source[n]) for n in scored)
        assert again.source_digest == files.source_digest  # deterministic: one identity
    finally:
        shutil.rmtree(files.root)
        shutil.rmtree(again.root)


def test_a_bfloat16_transport_reads_back_its_dtype_and_says_it_rounded(synced: Any) -> None:
    import torch

    sync = synced["bfloat16"]
    assert sync["sync"].stale == () and sync["knob"] == "reload"
    assert sync["dtype"] == "bfloat16" and sync["sync"].lossless is False
    assert sync["readings"]["rollout.weight_sync_lossless"] is False
    assert not torch.equal(sync["scores"], synced["load"]["scores"])


def test_a_withheld_tensor_reads_back_as_a_fallback_naming_it(synced: Any) -> None:
    """vLLM's CPU platform packs a linear weight into a kernel handle and leaves an empty
    parameter: the stale weight is found in the layer's effective weight (its forward)."""
    stale = synced["stale"]
    layer = WITHHELD.removesuffix(".weight")
    assert stale["sync"].stale == (f"0:effective:{layer}",)
    # read, not unreadable: a value that is not the request (a fallback, never "reload")
    assert isinstance(stale["knob"], str) and not isinstance(stale["knob"], ReadbackFailure)
    assert layer in stale["knob"] and stale["knob"] != "reload"
    # so the knob is a fallback naming the layer: strict execution refuses it (an error case),
    # without strict execution the case is judged and marked "intervention not applied"
    from xconf.knobs import KNOBS
    from xconf.runtime.materialization import apply_readback, strict_violations
    from xconf.runtime.protocol import KnobApplication, SideBinding

    path = "rollout.weight_sync"
    requested = KnobApplication(
        path, "rollout", KNOBS[path].lifecycle, "reload", "reload", None, "applied", "set"
    )
    binding = SideBinding("rollout", (requested,), "float32", (("world_size", 1),))
    (actual,) = apply_readback(binding, {path: stale["knob"]})
    assert actual.status == "fallback" and layer in actual.evidence, actual
    (refused,) = strict_violations((actual,), strict_fallback=True)
    assert refused.startswith("rollout:rollout.weight_sync fell back") and layer in refused
    assert strict_violations((actual,), strict_fallback=False) == []
