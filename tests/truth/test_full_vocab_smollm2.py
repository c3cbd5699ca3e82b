"""Full-vocabulary figures on the real pretrained default, checked by an independent referee.

Four cases of ``+experiment=s2_smollm2`` (SmolLM2-135M-Instruct, four chat prompts, 8
response tokens): the float32 baseline, the bfloat16 rollout, the injected reference
operator (its rows come from the operator path) and prompt-logprob scoring (the native
prefill path). The run is real; a spy around the runner's ``compare`` stores the rows both
sides handed over (safetensors) and lets the real comparison run. The referee
(``tests/full_vocab_reference.py``: numpy float64, no xconf import) recomputes every
figure from the stored rows and must agree with the sealed ``comparison.json``; the verdict
is the selected-token one, whatever the figures say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import full_vocab_reference as referee
from tests.adapters.conftest import needs_vllm

pytestmark = [needs_vllm, pytest.mark.slow]
CONF = Path(__file__).resolve().parents[2] / "conf"
# Four of the 24 chat prompts (their indices in conf/identity/smollm2_chat_s2.yaml).
PROMPTS = (0, 3, 14, 23)
# float64's floor on these figures: each side's log-sum-exp is rounded (~1e-16 of a row's
# |log-probability| of ~20), which shifts every term of a row's KL alike, so two correct
# float64 implementations differ by ~1e-15 absolute on a KL of ~1e-11 (measured: 1.4e-15).
FLOOR = 1e-13
OVERRIDES = [
    "+experiment=s2_smollm2",
    "runtime=vllm_hf",
    "identity.recipe.response_len=8",
    "+rollout.scoring_mode=decode",
    "interventions=[{path: rollout.dtype, values: [bfloat16]},"
    " {path: logp.backend, values: [xconf.reference_logp]},"
    " {path: rollout.scoring_mode, values: [prefill]}]",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    import torch
    from hydra import compose, initialize_config_dir
    from safetensors.torch import save_file

    import xconf.side_scoring
    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.runtime.loading import instantiate_runtime
    from xconf.session import prepare, run_prepared

    out = tmp_path_factory.mktemp("full_vocab")
    rows_dir = out / "rows"
    rows_dir.mkdir()
    real = xconf.side_scoring.compare

    def storing_compare(inputs: Any, digest: str, rollout: Any, training: Any, *a, **k) -> Any:
        outcome = real(inputs, digest, rollout, training, *a, **k)
        tensors = {"active_mask": inputs.active_mask.to(torch.uint8)}
        for side, score in (("rollout", rollout), ("training", training)):
            if score.vocab_rows is not None:
                tensors[side] = score.vocab_rows.contiguous()
        index = len(list(rows_dir.iterdir()))
        save_file(tensors, str(rows_dir / f"{index:02d}.safetensors"))
        (rows_dir / f"{index:02d}.json").write_text(json.dumps(outcome.document))
        return outcome

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=OVERRIDES)
    prompts = cfg.identity.recipe.prompts
    cfg.identity.recipe.prompts = [prompts[i] for i in PROMPTS]
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    prepared = prepare(spec, output_root=out, allow_smoke_operators=False, device="cpu")
    mp = pytest.MonkeyPatch()
    mp.setattr(xconf.side_scoring, "compare", storing_compare)
    try:
        summary = run_prepared(prepared, instantiate_runtime(cfg.runtime), resume=False)
    finally:
        mp.undo()
    return summary, rows_dir


def test_every_case_reports_the_full_vocabulary_figures(run: tuple[Any, Path]) -> None:
    summary, _ = run
    assert len(summary.records) == 4, [r.label for r in summary.records]
    for record in summary.records:
        path = Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)
        doc = json.loads((path / "comparison.json").read_text())
        assert doc["result"] in ("pass", "fail"), (record.label, doc.get("reason"))
        vocab = doc["full_vocab"]
        assert vocab["available"] is True, (record.label, vocab)
        assert vocab["case"]["positions"] == doc["active_tokens"] == 4 * 8
        assert len(vocab["sequences"]) == 4
    from rich.console import Console

    from xconf.report.terminal import render_terminal_summary
    from xconf.report.writer import write_report

    written = write_report(summary.experiment_dir, fmt="json")
    report = json.loads(written.path.read_text())
    rows = report["attribution"]
    assert len(rows) == 3 and all(r["kl_rollout_training"] is not None for r in rows), rows
    assert all(c["full_vocab"]["available"] for c in report["cases"])
    html = write_report(summary.experiment_dir, fmt="html").path.read_text()
    assert "KL(r‖t)" in html and "full vocabulary:" in html
    console = Console(width=200, record=True)
    render_terminal_summary(written.data, console)
    assert "KL(r‖t)" in console.export_text()


def test_the_referee_agrees_on_the_stored_rows(run: tuple[Any, Path]) -> None:
    from safetensors.numpy import load_file

    _, rows_dir = run
    stored = sorted(rows_dir.glob("*.safetensors"))
    assert len(stored) == 4
    bfloat16_rollout_moved = False
    for file in stored:
        tensors = load_file(str(file))
        section = json.loads(file.with_suffix(".json").read_text())["full_vocab"]
        figures = referee.figures(tensors["rollout"], tensors["training"])
        for name, values in figures.items():
            assert section["case"]["mean"][name] == pytest.approx(
                float(values.mean()), rel=1e-9, abs=FLOOR
            ), (file.name, name)
        want = referee.per_sequence(figures, tensors["active_mask"])
        for seq, expected in zip(section["sequences"], want, strict=True):
            for name, value in expected.items():
                assert seq["mean"][name] == pytest.approx(value, rel=1e-9, abs=FLOOR)
        bfloat16_rollout_moved |= section["case"]["mean"]["kl_rollout_training"] > 1e-6
    assert bfloat16_rollout_moved  # the bfloat16 rollout's distributions differ measurably
