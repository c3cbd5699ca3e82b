"""Bad plans that used to reach the engines: each is a coded exit 2 before anything is written.

The document-level ones (nesting, token ids, empty rows, operator options) are rows of
``tests/core/bad_inputs.py``, run through ``xconf plan`` and ``xconf run`` there. Here: what
only the model knows (vocabulary, context), runtime options in ``mode=plan``, operator aliases,
and the bound of the decode loop on a length-0 row.
"""

from __future__ import annotations

import copy
import json
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.commands import refused_in_process
from tests.core.runs import only
from xconf.adapters.cpu_smoke.engines import RolloutEngine
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.adapters.cpu_smoke.side import ROLLOUT
from xconf.config.strict import parse_experiment
from xconf.planner import plan_experiment

RUN = ("run", "--runtime", "cpu-smoke", "--allow-smoke-operators")


def _too_long(identity: dict) -> None:
    for field in ("token_ids", "selected_token_ids", "active_mask", "attention_mask"):
        identity[field] = [row + [row[-1]] * 60 for row in identity[field]]  # 76 > 64 positions
    identity["position_ids"] = [list(range(len(r))) for r in identity["token_ids"]]


def _oov_token(identity: dict) -> None:
    identity["token_ids"][1][2] = 97  # the synthetic vocabulary is [0, 97)


def _oov_selected(identity: dict) -> None:
    identity["selected_token_ids"][0][3] = 10**6


def _position_beyond(identity: dict) -> None:
    identity["position_ids"][2][15] = 64  # 64 positions: 0..63


# (id, mutation of the identity, code, the path the message names)
MODEL_LIMITS = [
    ("oov-token", _oov_token, "runtime.token_out_of_vocab", "identity.token_ids[1][2]"),
    (
        "oov-selected",
        _oov_selected,
        "runtime.token_out_of_vocab",
        "identity.selected_token_ids[0][3]",
    ),
    ("too-long", _too_long, "runtime.sequence_too_long", "identity.token_ids[0]"),
    (
        "position-beyond",
        _position_beyond,
        "runtime.sequence_too_long",
        "identity.position_ids[2][15]",
    ),
]
FRONT_ENDS = ("xconf-plan", "mode-plan", "mode-plan-multirun", "xconf-run")


def _identity_overrides(identity: dict) -> list[str]:
    """The cpu_smoke experiment's token rows replaced on the Hydra command line."""
    fields = ("token_ids", "selected_token_ids", "active_mask", "attention_mask", "position_ids")
    return [f"identity.{f}={json.dumps(identity[f]).replace(' ', '')}" for f in fields]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize(
    ("case", "mutate", "code", "named"), MODEL_LIMITS, ids=[c[0] for c in MODEL_LIMITS]
)
def test_what_the_model_cannot_take_is_refused_at_plan_time(
    xconf_cli,
    s0_doc,
    write_doc,
    tmp_path,
    monkeypatch,
    capsys,
    front_end,
    case,
    mutate,
    code,
    named,
) -> None:
    """``xconf plan --runtime``, ``mode=plan`` (also under ``-m``) and a run alike: exit 2,
    the code and the entry named, nothing written; the checkpoint's limits come from the
    runtime's options, no engine is built."""
    doc = only(copy.deepcopy(s0_doc), batch__size=[1])
    mutate(doc["identity"])
    out = tmp_path / "out"
    if front_end in ("xconf-plan", "xconf-run"):
        file = write_doc(doc)
        command = ["plan", file, "--runtime", "cpu-smoke"]
        if front_end == "xconf-run":
            command = [*RUN[:1], file, *RUN[1:]]
        rc, _, stderr = xconf_cli(*command, "--output-root", out)
        assert rc == 2 and f"[{code}] at '{named}'" in stderr, stderr
        assert not out.exists()
        return
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = ["-m", "batch.size=1,2"] if front_end == "mode-plan-multirun" else []
    argv += ["+experiment=cpu_smoke", "mode=plan", f"output_root={out}"]
    argv += _identity_overrides(doc["identity"])
    refused_in_process(monkeypatch, capsys, argv, code, f"'{named}'", case)
    assert not out.exists()  # (Hydra's own run directory holds only its logs)


def test_the_same_identity_plans_for_a_runtime_whose_model_takes_it(
    xconf_cli, s0_doc, write_doc, tmp_path
) -> None:
    """The limits are the runtime's: a larger synthetic vocabulary takes the id (the check
    reads the option, not a constant), and without --runtime the plan says it checked none."""
    doc = only(copy.deepcopy(s0_doc), batch__size=[1])
    _oov_token(doc["identity"])
    path = write_doc(doc)
    rc, _, stderr = xconf_cli(
        "plan",
        path,
        "--runtime",
        "cpu-smoke",
        "runtime.vocab_size=98",
        "--output-root",
        tmp_path / "a",
    )
    assert rc == 0, stderr
    rc, stdout, stderr = xconf_cli("plan", path, "--output-root", tmp_path / "b")
    assert rc == 0 and "not checked against" in " ".join(stdout.split()), stderr


def test_a_checkpoint_config_gives_the_real_runtime_its_limits(
    xconf_cli, s3_doc, write_doc, tmp_path
) -> None:
    """vllm-hf: the vocabulary and positions of ``runtime.model.path``'s config.json (read as
    JSON, nothing built), or the tiny model's when no path is given."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = {"model_type": "qwen3", "vocab_size": 151936, "max_position_embeddings": 40960}
    (checkpoint / "config.json").write_text(json.dumps(config))
    path = write_doc(s3_doc)  # Qwen3-8B ids up to 151645, 8 tokens a row
    # (the experiment is a GPU one: a CPU runtime's model is not checked against it)
    runtime = ("--runtime", "vllm-hf", "runtime.device=cuda")
    plan = ("plan", path, *runtime, f"runtime.model.path={checkpoint}")
    rc, _, stderr = xconf_cli(*plan, "--output-root", tmp_path / "a")
    assert rc == 0, stderr
    rc, _, stderr = xconf_cli(*plan, "runtime.max_model_len=4", "--output-root", tmp_path / "b")
    assert rc == 2 and "[runtime.sequence_too_long] at 'identity.token_ids[0]'" in stderr, stderr
    config["vocab_size"] = 151000
    (checkpoint / "config.json").write_text(json.dumps(config))
    rc, _, stderr = xconf_cli(*plan, "--output-root", tmp_path / "c")
    assert rc == 2 and "[runtime.token_out_of_vocab] at 'identity.token_ids[0][0]'" in stderr
    assert "config.json" in stderr
    tiny = (
        "plan",
        path,
        "--runtime",
        "vllm-hf",
        "runtime.device=cuda",
        "--output-root",
        tmp_path / "d",
    )
    rc, _, stderr = xconf_cli(*tiny)
    assert rc == 2 and "[runtime.token_out_of_vocab]" in stderr and "tiny qwen3" in stderr
    assert not any((tmp_path / d).exists() for d in "bcd")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+runtime.foo=1", "[runtime.unknown_option] at 'runtime.foo'"),
        ("+scenario.deep=" + "[" * 3000 + "]" * 3000, "[config.too_deep] at 'scenario.deep'"),
        ("batch.size=" + "9" * 5000, "[config.too_large] at 'batch.size'"),
        ("runtime.vocab_size=" + "9" * 5000, "[config.too_large] at 'runtime.vocab_size'"),
        ("runtime.vocab_size=true", "[config.wrong_type] at 'runtime.vocab_size'"),
        ("+rollout.dtyp\u0435=bfloat16", "[config.bad_override] at 'rollout.dtyp\u0435'"),
    ],
    ids=[
        "runtime-option",
        "nested-3000",
        "int-5000-digits",
        "runtime-int-5000",
        "vocab-bool",
        "cyrillic-knob",
    ],
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
    _no_handler_writes_into(tmp_path)


def _no_handler_writes_into(folder: Path) -> None:
    """The refused run's log handler left with its directory: closed (as any dictConfig
    closes handlers) and then sent a record, it would reopen a file whose folder is gone."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            assert not Path(handler.baseFilename).is_relative_to(folder), handler
    for handler in logging.getLogger().handlers:
        handler.close()
    logging.getLogger("xconf.tests.after_refusal").warning("a record after the refusal")


def test_a_refused_task_leaves_no_log_handler_behind(monkeypatch, tmp_path, capsys) -> None:
    """A value only the task can refuse (a runtime option): Hydra made its run directory and
    its job log's handler; both go, so the process logs on without an error."""
    from xconf.cli import hydra_app

    monkeypatch.chdir(tmp_path)
    argv = ["xconf-run", "+experiment=cpu_smoke", "mode=plan", "output_root=out"]
    monkeypatch.setattr(sys, "argv", [*argv, "runtime.vocab_size=true"])
    with pytest.raises(SystemExit) as info:
        hydra_app.main()
    assert info.value.code == 2
    assert "[config.wrong_type] at 'runtime.vocab_size'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    _no_handler_writes_into(tmp_path)


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
    engine = RolloutEngine(
        config,
        "float32",
        prefix_caching=True,
        eager=True,
        mode="decode",
        readback=ROLLOUT.readback,
    )
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
