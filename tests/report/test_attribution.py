"""Attribution that survives a failing baseline: per-knob effects with bootstrap intervals
over sequences, and a headline that names only what the intervals support."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from report_fixtures import CaseSpec, case_id_for, logprobs, write_run
from rich.console import Console

from xconf.report.attribution import RESAMPLES, SEED, describe, effect, sequence_sums
from xconf.report.build import build_report
from xconf.report.loader import TokenDiffs
from xconf.report.terminal import render_terminal_summary
from xconf.report.writer import render

BATCH, LENGTH = 8, 12
SPIKE = {"batch.size": 1}  # one large token in one sequence, the rest as the baseline
NOISY = {"training.attention_backend": "eager"}  # as much drift, redrawn: not different
WORSE = {"rollout.enable_prefix_caching": True}  # twice the drift in every sequence
FIXED = {"rollout.enforce_eager": False}  # a hundredth of the drift: under the threshold


def _failing_baseline_run(root: Path, with_fix: bool = True) -> Path:
    """A float32 baseline that fails (a few tokens over 1e-5, as SmolLM2's does)."""
    base = logprobs(BATCH, LENGTH, 0)
    active = np.ones((BATCH, LENGTH), dtype=bool)
    active[:, :3] = False  # the prompt
    rng = np.random.default_rng(5)
    drift = rng.normal(0, 2e-6, size=base.shape).astype(np.float32)
    drift[2, 7] = 2.0e-5  # over the float32 threshold
    redrawn = rng.normal(0, 2e-6, size=base.shape).astype(np.float32)
    redrawn[6, 5] = 2.0e-5  # fails like the baseline, elsewhere
    spike = drift.copy()
    spike[4, 9] = 4e-4  # the largest max |diff| and the most mismatches of all
    specs = [
        CaseSpec({}, base, base + drift, active, kind="baseline"),
        CaseSpec(SPIKE, base, base + spike, active),
        CaseSpec(NOISY, base, base + redrawn, active),
        CaseSpec(WORSE, base, base + 2 * drift, active),
    ]
    if with_fix:
        specs.append(CaseSpec(FIXED, base, base + drift / 100, active))
    return write_run(root, "failing-baseline", specs)


def test_a_failing_baseline_comes_first_and_names_what_brings_it_under(tmp_path: Path) -> None:
    data = build_report(_failing_baseline_run(tmp_path))
    assert data.baseline is not None and data.baseline.result == "fail"
    headline = data.headline
    assert headline is not None and headline.baseline_fails
    assert headline.lines[0].startswith("baseline fails: 1 of 72 active tokens over the threshold")
    assert headline.lines[1] == "brings it under the threshold: rollout.enforce_eager=false"
    assert headline.under_threshold == ("rollout.enforce_eager=false",)
    assert headline.most_drift == "rollout.enable_prefix_caching"
    assert headline.lines[2].startswith("most drift: rollout.enable_prefix_caching=true")
    rows = {r.case_id: r for r in data.attribution}
    worse = rows[case_id_for(WORSE)].effect
    assert worse is not None and worse.ratio is not None
    # twice the drift (up to float32 rounding of logprobs near -2)
    assert abs(worse.ratio - 2.0) < 0.1 and worse.ratio_low is not None
    assert 1.8 < worse.ratio_low <= worse.ratio <= (worse.ratio_high or 0) < 2.2
    # The spike has the largest max |diff| and the most mismatches: the old headline's pick.
    spike = rows[case_id_for(SPIKE)]
    assert spike.max_abs_diff == max(r.max_abs_diff or 0 for r in data.attribution)
    assert spike.effect is not None and spike.effect.delta_low is not None
    assert spike.effect.delta_low <= 0 <= (spike.effect.delta_high or 0)
    assert describe(spike.effect).startswith("≈ same")
    noisy = rows[case_id_for(NOISY)].effect
    assert noisy is not None and describe(noisy).startswith("≈ same")


def test_no_knob_named_when_every_interval_includes_the_baseline(tmp_path: Path) -> None:
    """Only noise and a one-token spike against a failing baseline: the headline says that no
    knob brings it under, and names no knob, though one has far the largest max |diff|."""
    run = _failing_baseline_run(tmp_path, with_fix=False)
    plan = run / "plan.jsonl"
    worse = case_id_for(WORSE)
    rows = [r for r in plan.read_text().splitlines() if worse not in r]
    plan.write_text("\n".join(rows) + "\n")
    header = json.loads((run / "experiment.json").read_text())
    from xconf.artifacts.plan_seal import plan_bytes, plan_digest

    header["plan_sha256"] = plan_digest(plan_bytes([json.loads(r) for r in rows]))
    (run / "experiment.json").write_text(json.dumps(header))
    import shutil

    shutil.rmtree(run / "cases" / worse)
    data = build_report(run)
    headline = data.headline
    assert headline is not None and headline.most_drift is None
    assert headline.lines[0].startswith("baseline fails")
    assert headline.lines[1] == "no knob brings it under the threshold"
    assert headline.lines[2].startswith("most drift: no knob moves drift distinguishably")
    console = Console(record=True, width=200)
    render_terminal_summary(data, console, None)
    text = console.export_text()
    assert "most drift: batch.size" not in text
    assert text.index("baseline fails") < text.index("most drift: no knob")
    assert "≈ same" in text  # each intervention's interval, in the terminal table
    page = render(data, "html")
    assert 'data-baseline-fails="true"' in page and "none distinguishable" in page


def test_intervals_are_seeded_and_stored_in_every_form(tmp_path: Path) -> None:
    run = _failing_baseline_run(tmp_path)
    first, again = build_report(run), build_report(run)
    effects = [r.effect for r in first.attribution]
    assert effects == [r.effect for r in again.attribution]  # bitwise: a fixed seed
    document = json.loads(render(first, "json"))
    stored = {r["case_id"]: r["effect"] for r in document["attribution"]}
    worse = stored[case_id_for(WORSE)]
    assert (worse["resamples"], worse["seed"], worse["confidence"]) == (RESAMPLES, SEED, 0.95)
    assert worse["sequences"] == BATCH and worse["delta_low"] > 0
    assert document["headline"]["baseline_fails"] is True
    console = Console(record=True, width=200)
    render_terminal_summary(first, console, None, table=False)
    text = console.export_text()
    assert "effect on mean |diff| against the baseline (95% interval, 8 sequences)" in text
    shown = describe(next(r.effect for r in first.attribution if r.case_id == case_id_for(WORSE)))
    assert shown.startswith("×") and shown in text
    page = render(first, "html")
    assert shown in page and "paired bootstrap interval over sequences" in page


def _diffs(abs_diff: np.ndarray) -> TokenDiffs:
    active = np.ones(abs_diff.shape, dtype=bool)
    zeros = np.zeros(abs_diff.shape, dtype=np.float32)
    return TokenDiffs(zeros, zeros, active, abs_diff.astype(np.float32), active, 1e-5, None)


def test_the_interval_resamples_sequences_not_tokens() -> None:
    """Every token of a sequence moves together: a case that doubles the drift of half the
    sequences and halves the other half's has an interval that spans both, however many
    tokens each holds."""
    base = np.full((6, 400), 1e-6)
    case = base.copy()
    case[:3] *= 2.0
    case[3:] *= 0.5
    e = effect(sequence_sums(_diffs(base)), sequence_sums(_diffs(case)))
    assert e is not None and e.delta_low is not None and e.delta_high is not None
    assert e.delta_low < 0 < e.delta_high and describe(e).startswith("≈ same")
    # Unpaired inputs (other active tokens) give no effect at all.
    other = _diffs(base)
    mask = other.active_mask.copy()
    mask[0, 0] = False
    moved = TokenDiffs(
        other.rollout_logprobs,
        other.training_logprobs,
        mask,
        other.abs_diff,
        mask,
        other.threshold,
        None,
    )
    assert effect(sequence_sums(_diffs(base)), sequence_sums(moved)) is None
