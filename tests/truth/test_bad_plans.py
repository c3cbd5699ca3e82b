"""Bad plans that used to reach the engines: each is a coded exit 2 before anything is written.

The document-level ones (nesting, token ids, empty rows, operator options) are rows of
``tests/core/bad_inputs.py``, run through ``xconf plan`` and ``xconf run`` there. Here: what
only the model knows (vocabulary, context), runtime options in ``mode=plan``, operator aliases,
and the bound of the decode loop on a length-0 row.
"""

from __future__ import annotations

import copy
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.core.runs import only
from xconf.adapters.cpu_smoke.engines import RolloutEngine
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.config.strict import parse_experiment
from xconf.planner import plan_experiment

RUN = ("run", "--runtime", "cpu-smoke", "--allow-smoke-operators")


def _too_long(doc) -> None:
    identity = doc["identity"]
    for field in ("token_ids", "selected_token_ids", "active_mask", "attention_mask"):
        identity[field] = [row + [row[-1]] * 60 for row in identity[field]]  # 76 > 64 positions
    identity["position_ids"] = [list(range(len(r))) for r in identity["token_ids"]]


@pytest.mark.parametrize(
    ("case", "code"),
    [("oov", "runtime.token_out_of_vocab"), ("too-long", "runtime.sequence_too_long")],
)
def test_what_the_model_cannot_take_is_refused_before_a_run_writes(
    xconf_cli, s0_doc, write_doc, tmp_path, case, code
) -> None:
    doc = only(copy.deepcopy(s0_doc), batch__size=[1])
    if case == "oov":
        doc["identity"]["selected_token_ids"][0][3] = 97  # the synthetic vocabulary is 97
    else:
        _too_long(doc)
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli(*RUN[:1], write_doc(doc), *RUN[1:], "--output-root", out)
    assert rc == 2 and f"[{code}]" in stderr, stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+runtime.foo=1", "[runtime.unknown_option] at 'runtime.foo'"),
        ("+scenario.deep=" + "[" * 3000 + "]" * 3000, "[config.too_deep] at 'scenario.deep'"),
    ],
    ids=["runtime-option", "nested-3000"],
)
def test_bad_overrides_are_refused_in_plan_mode(
    monkeypatch, tmp_path, capsys, override, expected
) -> None:
    from xconf.cli import hydra_app

    monkeypatch.chdir(tmp_path)
    argv = ["xconf-run", "+experiment=cpu_smoke", "mode=plan", "output_root=out"]
    monkeypatch.setattr(sys, "argv", [*argv, override])
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    assert info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_operator_aliases_plan_one_case_id(s0_doc) -> None:
    ids = set()
    for spelling in ("rlkernel.reference_logp", "xconf.reference_logp", " XCONF.Reference_Logp "):
        doc = only(copy.deepcopy(s0_doc), batch__size=[1])
        doc["operators"] = {"selected_logprob": {"rollout": spelling, "training": "native"}}
        plan = plan_experiment(parse_experiment(doc))
        assert plan.spec.operators is not None and plan.spec.operators.rollout is not None
        assert plan.spec.operators.rollout.backend == "xconf.reference_logp"
        ids.add(tuple(c.case_id for c in plan.cases))
    assert len(ids) == 1, ids


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def stop(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds}s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_prefix_cached_decode_loop_ends_on_a_length_0_row() -> None:
    config = SyntheticModelConfig()
    engine = RolloutEngine(config, "float32", prefix_caching=True, eager=True, mode="decode")
    empty = torch.zeros(1, 0, dtype=torch.int64)
    with _deadline(5.0):
        logits = engine._logits(empty, empty)
    assert tuple(logits.shape) == (1, 0, config.vocab_size)


def test_an_empty_row_does_not_reach_a_run(xconf_cli, s0_doc, write_doc, tmp_path: Path) -> None:
    doc = only(copy.deepcopy(s0_doc), rollout__enable_prefix_caching=[True])
    for field in ("token_ids", "selected_token_ids", "active_mask", "attention_mask"):
        doc["identity"][field][1] = []
    doc["identity"]["position_ids"][1] = []
    out = tmp_path / "out"
    rc, _, stderr = xconf_cli(*RUN[:1], write_doc(doc), *RUN[1:], "--output-root", out)
    assert rc == 2 and "identity.token_ids[1]" in stderr, stderr
    assert not out.exists()
