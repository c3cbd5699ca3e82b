"""Metamorphic, on the real pretrained default: a plan run forward and reversed scores alike.

Five cases of ``+experiment=s2_smollm2`` (SmolLM2-135M-Instruct, 24 chat prompts, 8 response
tokens each to stay quick) chosen to cross every kind of engine reuse: ``batch.size=1``
reuses both engines of the baseline, prefix caching and the bfloat16 rollout need engines
of their own while the training engine is reused, eager attention the other way round. The
runner groups cases by construction fingerprint, so reversing the plan changes which engine
is built first, which engine scored what before each case, and which engines' teardown
(frozen collector, workers reaped in the background) overlaps which build. The forward run
reuses sides (eager attention takes the baseline's rollout scores, the bfloat16 rollout and
prefix caching the baseline's training scores), the reversed one scores every side
(``reuse_sides=False``): no bit of any verdict, token diff or score may move.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from tests.truth.order import reversed_plan
from xconf.artifacts.store import read_tensors

pytestmark = [needs_vllm, pytest.mark.slow]
CONF = Path(__file__).resolve().parents[2] / "conf"
OVERRIDES = [
    "+experiment=s2_smollm2",
    "runtime=vllm_hf",
    "identity.recipe.response_len=8",
    "interventions=[{path: batch.size, values: [1]},"
    " {path: rollout.enable_prefix_caching, values: [true]},"
    " {path: training.attention_backend, values: [eager]},"
    " {path: rollout.dtype, values: [bfloat16]}]",
]


def _run(out: Path, reverse: bool, reuse_sides: bool = True) -> tuple[Any, list[str]]:
    from hydra import compose, initialize_config_dir

    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=OVERRIDES)
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    prepared = prepare(spec, output_root=out, allow_smoke_operators=False, device="cpu")
    if reverse:
        prepared = reversed_plan(prepared)
    order: list[str] = []
    summary = run_prepared(
        prepared,
        instantiate_runtime(cfg.runtime),
        resume=False,
        on_case=lambda r: order.append(r.label),
        reuse_sides=reuse_sides,
    )
    return summary, order


def _attempt(summary: Any, record: Any) -> Path:
    return Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)


def test_real_default_forward_and_reversed_score_bitwise_alike(tmp_path: Path) -> None:
    forward, forward_order = _run(tmp_path / "forward", reverse=False)
    backward, backward_order = _run(tmp_path / "backward", reverse=True, reuse_sides=False)
    assert len(forward.records) == 5, [r.label for r in forward.records]
    assert (forward.sides_reused, backward.sides_reused) == (3, 0)
    assert forward_order != backward_order, forward_order
    assert forward.engines_reused > 0 and backward.engines_reused > 0
    for a, b in zip(forward.records, backward.records, strict=True):
        assert a.case_id == b.case_id and a.result == b.result, (a, b)
        assert a.result in ("pass", "fail"), a  # every case scored on this model
        for name in ("score_rollout.safetensors", "score_training.safetensors"):
            fwd = read_tensors(_attempt(forward, a) / name)["logprobs"]
            bwd = read_tensors(_attempt(backward, b) / name)["logprobs"]
            assert fwd.numpy().tobytes() == bwd.numpy().tobytes(), (a.label, name)
        # the verdict document and the token diffs too, byte for byte
        for name in ("comparison.json", "token_diffs.safetensors"):
            same = (_attempt(forward, a) / name).read_bytes() == (
                _attempt(backward, b) / name
            ).read_bytes()
            assert same, (a.label, name)
