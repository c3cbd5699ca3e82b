"""`xconf localize` on transformers sides: the planted layer is named, a clean case shows no
divergence, the artifact is sealed and leaves the run verifiable, the report draws it."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from tests.adapters.conftest import needs_hf
from tests.localize import planted
from tests.localize.conftest import PLANT_TRAINING, case_of, run_dir
from xconf.artifacts.localization import latest
from xconf.artifacts.safe_io import sha256_file
from xconf.localize.service import localize_case
from xconf.verify import verify_run

pytestmark = needs_hf


def test_planted_training_mlp_is_named(planted_run) -> None:
    case = case_of(planted_run)
    assert next(r for r in planted_run.records if r.case_id == case).result == "fail"
    result = localize_case(
        run_dir(planted_run), case, adapter=planted.runtime("hf_pair", PLANT_TRAINING)
    )
    doc = result.document
    assert result.line == "first divergence: layer 3 MLP output"
    assert doc["first_divergence"]["key"] == "layers.3.mlp"
    rows = {r["key"]: r for r in doc["taps"]}
    # The same transformers module on both sides: bitwise equal up to the planted module,
    # then the 1e-3 scale itself.
    before = [r for r in doc["taps"][: [r["key"] for r in doc["taps"]].index("layers.3.mlp")]]
    assert before and all(r["case_relative"] == 0.0 and not r["above"] for r in before)
    assert abs(rows["layers.3.mlp"]["case_relative"] - 1e-3) < 1e-6
    assert all(r["floor"] == 0.0 for r in doc["taps"])  # two identical baseline sides
    assert rows["logits"]["above"]
    # sealed beside the attempt, never inside it: the run still verifies
    seal = json.loads((result.path / "COMPLETE").read_text())
    assert sorted(p.name for p in result.path.iterdir()) == [
        "COMPLETE",
        "localize.json",
        "taps.safetensors",
    ]
    for name, digest in seal["files"].items():
        assert sha256_file(result.path / name) == digest
    taps = load_file(str(result.path / "taps.safetensors"))
    assert taps["case_relative"].shape == (len(doc["taps"]),)
    assert float(taps["case_relative"][len(before)]) == rows["layers.3.mlp"]["case_relative"]
    stored = latest(run_dir(planted_run), case)
    assert stored is not None and stored["line"] == result.line
    report = verify_run(run_dir(planted_run))
    assert report.count("damaged") == 0 and report.count("valid") == 2


def test_a_tampered_artifact_is_not_read_back(planted_run, tmp_path) -> None:
    import shutil

    case = case_of(planted_run)
    if latest(run_dir(planted_run), case) is None:
        localize_case(
            run_dir(planted_run), case, adapter=planted.runtime("hf_pair", PLANT_TRAINING)
        )
    copy = tmp_path / "planted"
    shutil.copytree(run_dir(planted_run), copy)
    docs = sorted((copy / "localize" / case).rglob("localize.json"))
    assert docs
    for doc in docs:
        doc.chmod(0o644)
        doc.write_text(doc.read_text().replace("layer 3", "layer 0"))
    assert latest(copy, case) is None


def test_clean_case_has_no_divergence_via_cli(clean_run, xconf_cli) -> None:
    rc, out, err = xconf_cli("localize", run_dir(clean_run), case_of(clean_run))
    assert rc == 0, err
    assert out.strip().splitlines()[-1].startswith("first divergence: none")
    assert "layer 1 residual stream" in out and "[/]" not in out  # the table, verbatim
    doc = latest(run_dir(clean_run), case_of(clean_run))
    assert doc is not None
    assert doc["first_divergence"] is None and doc["checkpoint_verified"] is False
    assert all(r["case_relative"] == 0.0 for r in doc["taps"])


def test_engine_output_goes_to_the_run_log_unless_verbose(clean_run) -> None:
    """As in a run, transformers' own output (its weight-loading bars) lands in the run's
    xconf.log; the terminal shows xconf's table and line; `--verbose` shows both."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    log = run_dir(clean_run) / "xconf.log"
    before = log.read_text() if log.exists() else ""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "xconf.cli.main", "localize"]
    argv += [str(run_dir(clean_run)), case_of(clean_run)]
    quiet = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout.strip().splitlines()[-1].startswith("first divergence: none")
    assert "Loading weights" not in quiet.stdout + quiet.stderr
    grown = log.read_text()[len(before) :]
    assert grown.startswith("== xconf: third-party output") and "Loading weights" in grown
    loud = subprocess.run(
        [*argv, "--verbose"], env=env, capture_output=True, text=True, timeout=300
    )
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "Loading weights" in loud.stdout + loud.stderr
    assert log.read_text() == before + grown  # verbose writes no log


def test_report_draws_the_drift_chart(planted_run) -> None:
    from xconf.report.build import build_report
    from xconf.report.html import render_html

    case = case_of(planted_run)
    if latest(run_dir(planted_run), case) is None:
        localize_case(
            run_dir(planted_run), case, adapter=planted.runtime("hf_pair", PLANT_TRAINING)
        )
    page = render_html(build_report(run_dir(planted_run)))
    assert 'id="localize"' in page and 'data-plot="localize"' in page
    assert "first divergence: layer 3 MLP output" in page


def test_llama_name_map_names_a_planted_attention(model_cache, tmp_path) -> None:
    plant = {"side": "training", "module": "model.layers.1.self_attn", "factor": 1 + 1e-3}
    summary = planted.run(
        planted.experiment("planted-llama", planted.OPERATOR_CASE),
        tmp_path,
        planted.runtime("hf_pair", plant, layers=2, arch="llama"),
    )
    case = case_of(summary)
    result = localize_case(
        run_dir(summary), case, adapter=planted.runtime("hf_pair", plant, layers=2, arch="llama")
    )
    assert result.document["architecture"] == "LlamaForCausalLM"
    assert result.line == "first divergence: layer 1 attention output"


def test_localize_step_after_a_run_draws_each_failing_case(planted_run) -> None:
    """The `--localize` step: the service localizes every failing case (here the planted
    one) and the front-end's view only draws what it hands over."""
    from rich.console import Console

    from xconf.cli.render import ConsoleView
    from xconf.localize.service import localize_failing

    view = ConsoleView(Console(record=True, width=120, markup=False))
    errors: list[object] = []
    failing = localize_failing(
        planted_run,
        planted.runtime("hf_pair", PLANT_TRAINING),
        on_result=view.localized,
        on_error=errors.append,
    )
    assert (failing, errors) == (1, [])
    text = view.console.export_text()
    assert "drift by tap: case " + case_of(planted_run) in text
    assert "first divergence: layer 3 MLP output" in text
    view.localized(None)
    assert view.console.export_text().strip() == "localize: no failing case"


def test_past_the_memory_bound_the_worst_samples_are_replayed(planted_run, monkeypatch) -> None:
    """With room for one sample only, localize replays the case's worst sample, says so, and
    still names the planted layer (floor and case measured on the same sample)."""
    import numpy as np
    from safetensors.numpy import load_file

    from xconf.localize import budget

    monkeypatch.setattr(budget, "MAX_BYTES", 1)
    case = case_of(planted_run)
    record = next(r for r in planted_run.records if r.case_id == case)
    attempt = run_dir(planted_run) / "cases" / case / record.attempt_id
    diffs = load_file(str(attempt / "token_diffs.safetensors"))
    worst = np.where(diffs["active_mask"].astype(bool), diffs["abs_diff"], -1).max(axis=1)
    result = localize_case(
        run_dir(planted_run), case, adapter=planted.runtime("hf_pair", PLANT_TRAINING)
    )
    scoring = result.document["scoring"]
    assert scoring["samples"] == [int(np.argmax(worst))]
    assert scoring["samples_note"].startswith("1 of 2 frozen samples")
    assert result.line == "first divergence: layer 3 MLP output"
