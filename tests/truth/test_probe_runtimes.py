"""Hostile runtimes the independent probes found believed (or crashing the run): each ends in
an honest verdict or a coded refusal, never a `pass`, an exit 0 with a case unscored, or a
traceback."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.core.runs import only, run_doc
from tests.truth import liars
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.errors import XconfError
from xconf.session import exit_code
from xconf.verify import verify_run

EAGER = "training.attention_backend=eager"


class ExitsWhileScoring(liars.Liar):
    """Calls sys.exit(0) from inside its training engine's score (an engine's worker may)."""

    def __init__(self) -> None:
        super().__init__("training.attention_backend", "eager", side="training")

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        raise SystemExit(0)


class ReadsBackBoolForInt(liars.Liar):
    """Reads back True for TP=1 and 0 for enforce_eager=False: equal in Python, not as values."""

    def __init__(self) -> None:
        super().__init__("rollout.enforce_eager", False, side="rollout")

    def bent_readback(self, engine: Any) -> Any:
        live = dict(engine.readback())
        live["rollout.tensor_parallel_size"] = True
        live["rollout.enforce_eager"] = 0
        return live


class NanEnvironment(CpuSmokeRuntime):
    def environment(self) -> Any:
        return {**super().environment(), "build": float("nan")}


class TickingEnvironment(CpuSmokeRuntime):
    """environment() says something new on every call."""

    ticks = 0

    def environment(self) -> Any:
        TickingEnvironment.ticks += 1
        return {**super().environment(), "tick": str(TickingEnvironment.ticks)}


class AltersDeclaredIdentity(CpuSmokeRuntime):
    """Freezes a declared identity with one token changed, then scores that."""

    def freeze_identity(self, identity: Any) -> Any:
        rows = [list(r) for r in identity.token_ids]
        rows[0][6] = (rows[0][6] + 1) % self.model_config.vocab_size
        return replace(identity, token_ids=tuple(tuple(r) for r in rows))


class BindsAnotherCase(CpuSmokeRuntime):
    def bind(self, case: Any, identity: Any) -> Any:
        return replace(super().bind(case, identity), case_id="c-0000000000000000")


def _doc(s0_doc, **interventions: list[Any]) -> dict[str, Any]:
    return only(
        copy.deepcopy(s0_doc), **(interventions or {"training__attention_backend": ["eager"]})
    )


def test_a_runtime_that_exits_while_scoring_leaves_an_error_not_exit_0(s0_doc, tmp_path) -> None:
    summary = run_doc(_doc(s0_doc), tmp_path, adapter=ExitsWhileScoring())
    results = {r.label: r.result for r in summary.records}
    assert results == {"baseline": "pass", EAGER: "error"}
    assert exit_code(summary.records) == 1


def test_a_bool_read_back_for_an_int_knob_is_not_applied(s0_doc, tmp_path) -> None:
    doc = _doc(s0_doc, rollout__enforce_eager=[False])
    summary = run_doc(doc, tmp_path, adapter=ReadsBackBoolForInt())
    results = {r.label: r.result for r in summary.records}
    assert results == {"baseline": "pass", "rollout.enforce_eager=False": "error"}


@pytest.mark.parametrize(
    ("adapter", "code"),
    [
        (NanEnvironment(), "runtime.bad_environment"),
        (AltersDeclaredIdentity(), "identity.altered_by_runtime"),
        (BindsAnotherCase(), "runtime.bind_mismatch"),
    ],
    ids=["environment-not-text", "identity-altered", "bind-another-case"],
)
def test_a_runtime_that_lies_about_the_run_is_refused(s0_doc, tmp_path, adapter, code) -> None:
    with pytest.raises(XconfError) as refused:
        run_doc(_doc(s0_doc), tmp_path, adapter=adapter)
    assert refused.value.code == code


def test_an_environment_read_once_gives_every_sealed_attempt_its_own_key(
    s0_doc, tmp_path: Path
) -> None:
    summary = run_doc(_doc(s0_doc), tmp_path, adapter=TickingEnvironment())
    assert {r.result for r in summary.records} == {"pass"}
    assert verify_run(Path(summary.experiment_dir)).exit_code == 0
