"""`xconf judge`: dumps in every accepted format, sealed like a run; every bad dump refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import snapshot

R = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.25, -1.5, -2.5, 0.0]])
DELTA = torch.tensor([[0.0, 2e-3, -1e-6, 0.0], [0.0, 0.0, 3e-2, 0.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.int64)


def _verl(tmp_path: Path, **extra: torch.Tensor) -> Path:
    tensors = {"rollout_log_probs": R, "old_log_probs": R + DELTA, "response_mask": MASK}
    tensors.update(extra)
    path = tmp_path / "step.safetensors"
    save_file(tensors, str(path))
    return path


def _comparison(run: Path, case: str) -> dict:
    (attempt,) = sorted((run / "cases" / case).iterdir())
    return json.loads((attempt / "comparison.json").read_text())


def test_safetensors_npz_parquet_agree_and_verify(xconf_cli, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    st = _verl(tmp_path, responses=torch.arange(8).reshape(2, 4))
    npz = tmp_path / "step.npz"
    np.savez(
        npz,
        rollout_log_probs=R.numpy(),
        old_log_probs=(R + DELTA).numpy(),
        response_mask=MASK.numpy(),
        dtype=np.array("float32"),
    )
    parquet = tmp_path / "step.parquet"
    f32 = pa.list_(pa.float32())  # float32 lists: a double column is a float64 dump
    pq.write_table(
        pa.table(
            {
                "rollout_log_probs": pa.array(R.tolist(), type=f32),
                "old_log_probs": pa.array((R + DELTA).tolist(), type=f32),
                "response_mask": MASK.tolist(),
                "uid": ["a", "b"],  # a scalar column: ignored
            }
        ),
        parquet,
    )
    out = tmp_path / "out"
    code, stdout, err = xconf_cli(
        "judge", "--case", f"st={st}", "--case", f"npz={npz}", "--case", f"pq={parquet}",
        "--dtype", "float32", "--output-root", out,
    )  # fmt: skip
    assert code == 1, err  # the 3e-2 token fails the float32 threshold
    run = out / "judge"
    docs = {c: _comparison(run, c) for c in ("st", "npz", "pq")}
    for doc in docs.values():
        assert (doc["result"], doc["active_tokens"], doc["mismatches"]) == ("fail", 7, 2)
        assert (
            doc["rollout_correction"]["metrics"]["kl"]
            == docs["st"]["rollout_correction"]["metrics"]["kl"]
        )
    assert xconf_cli("verify", run)[0] == 0
    # bfloat16 from the command line: the 5e-2 threshold passes every token.
    code, _, err = xconf_cli("judge", st, "--dtype", "bfloat16", "--output-root", tmp_path / "b")
    assert code == 0, err
    # Judging the same dump again reuses the sealed attempt.
    code, stdout, _ = xconf_cli("judge", st, "--dtype", "bfloat16", "--output-root", tmp_path / "b")
    assert code == 0 and "reused" in stdout


def test_zero_active_mask_is_an_honest_verdict(xconf_cli, tmp_path: Path) -> None:
    path = tmp_path / "empty.safetensors"
    save_file(
        {"rollout_log_probs": R, "old_log_probs": R.clone(), "response_mask": torch.zeros(2, 4)},
        str(path),
        metadata={"dtype": "float32"},
    )
    code, _, err = xconf_cli("judge", path, "--output-root", tmp_path / "out")
    assert code == 1, err
    assert _comparison(tmp_path / "out" / "judge", "empty")["result"] == "zero_active_tokens"


FLOAT32 = ("--dtype", "float32")
IS_BAD = ("--rollout-is", "token", "--rollout-is-threshold", "2_1")  # lower above upper
RS_BAD = ("--rollout-rs", "token_k9", "--rollout-rs-threshold", "1")  # no such option


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    missing = tmp_path / "missing.safetensors"
    save_file({"rollout_log_probs": R, "response_mask": MASK}, str(missing))
    shapes = tmp_path / "shapes.safetensors"
    save_file(
        {"rollout_log_probs": R, "old_log_probs": R[:, :3].contiguous(), "response_mask": MASK},
        str(shapes),
    )
    pt = tmp_path / "step.pt"
    pt.write_bytes(b"\x80\x04not really a pickle, and never opened")
    objects = tmp_path / "objects.npz"
    np.savez(objects, rollout_log_probs=np.array([{"a": 1}], dtype=object))
    bad_mask = tmp_path / "badmask.safetensors"
    save_file(
        {"rollout_log_probs": R, "old_log_probs": R.clone(), "response_mask": MASK * 2},
        str(bad_mask),
    )
    good = _verl(tmp_path)
    return [
        (["judge", str(missing), "--dtype", "float32"], "judge.missing_key"),
        (["judge", str(shapes), "--dtype", "float32"], "judge.shape_mismatch"),
        (["judge", str(pt), "--dtype", "float32"], "judge.pickle_format"),
        (["judge", str(objects), "--dtype", "float32"], "judge.unreadable"),
        (["judge", str(bad_mask), "--dtype", "float32"], "judge.bad_mask"),
        (["judge", str(good)], "judge.no_dtype"),
        (["judge", str(good), "--dtype", "float8"], "judge.unknown_dtype"),
        (["judge", "--case", f"a b={good}", "--dtype", "float32"], "judge.bad_case_name"),
        (["judge", str(good), "--rollout-key", "nope", "--dtype", "float32"], "judge.missing_key"),
        (["judge", str(good), *FLOAT32, *IS_BAD], "judge.bad_correction"),
        (["judge", str(good), *FLOAT32, *RS_BAD], "judge.bad_correction"),
    ]


def test_bad_dumps_exit_2_with_code_and_write_nothing(xconf_cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for argv, code_name in _bad_inputs(tmp_path):
        before = snapshot(tmp_path)
        code, _, err = xconf_cli(*argv, "--output-root", out)
        assert code == 2, (argv, err)
        assert f"[{code_name}]" in err, (argv, err)
        assert snapshot(tmp_path) == before, argv
        assert not out.exists()


def test_pickle_refusal_shows_the_safetensors_export(xconf_cli, tmp_path: Path) -> None:
    pt = tmp_path / "dump.pkl"
    pt.write_bytes(b"never read")
    code, _, err = xconf_cli("judge", pt, "--dtype", "float32", "--output-root", tmp_path / "o")
    assert code == 2
    assert "from safetensors.torch import save_file" in err and "save_file({" in err


@pytest.mark.parametrize("key", ["responses", "input_ids"])
def test_token_ids_from_responses_or_input_ids(xconf_cli, tmp_path: Path, key: str) -> None:
    ids = torch.arange(8).reshape(2, 4)
    extra = {key: ids if key == "responses" else torch.cat([torch.ones(2, 3).long(), ids], 1)}
    path = _verl(tmp_path, **extra)
    code, _, err = xconf_cli("judge", path, "--dtype", "bfloat16", "--output-root", tmp_path / "o")
    assert code == 0, err
    (attempt,) = sorted((tmp_path / "o" / "judge" / "cases" / "step").iterdir())
    # Per-token payloads are safetensors, never JSON: the ids are in the score tensors.
    identity = json.loads((attempt / "identity.json").read_text())
    assert identity["selected_token_ids"] == [] and identity["recipe"]["shape"] == [2, 4]
    from safetensors.torch import load_file

    score = load_file(str(attempt / "score_rollout.safetensors"))
    # every per-token payload once: one token table (the scored tokens are the response
    # tokens; int32 fits), both sides' logprobs in token_diffs alone
    payload = identity["recipe"]["token_payload"]
    assert payload["same_as"] == {"selected_token_ids": "token_ids"}
    assert payload["logprobs"] == "token_diffs.safetensors"
    assert set(score) == {"token_ids", "active_mask"}
    assert score["token_ids"].dtype == torch.int32 and torch.equal(score["token_ids"].long(), ids)
    assert load_file(str(attempt / "score_training.safetensors")) == {}
    diffs = load_file(str(attempt / "token_diffs.safetensors"))
    assert torch.equal(diffs["rollout_logprobs"], torch.where(MASK.bool(), R, 0.0))


def test_an_attempt_of_the_older_layout_still_verifies(tmp_path: Path, monkeypatch) -> None:
    # xconf-judge.v2 wrote the token fields into both score files (selected_token_ids beside
    # token_ids, int64): such an attempt still verifies, and one whose copies disagree is
    # still named.
    from safetensors.torch import load_file, save

    from tests.truth.forgery import reseal as _reseal
    from xconf.artifacts.store import ExperimentStore
    from xconf.case_documents import score_tensors
    from xconf.judge import seal
    from xconf.judge.dumps import Keys, load_dump
    from xconf.verify import verify_run

    def old_files(rollout, training):
        return {
            "score_rollout.safetensors": score_tensors(rollout),
            "score_training.safetensors": score_tensors(training),
        }

    fields = ["token_ids", "selected_token_ids", "active_mask"]
    monkeypatch.setattr(seal, "TOKEN_PAYLOAD", {"file": seal.TOKEN_FILE, "tensors": fields})
    monkeypatch.setattr(seal, "score_files", old_files)
    path = _verl(tmp_path, responses=torch.arange(8).reshape(2, 4))
    case = seal.resolve_dtypes(load_dump("step", path, Keys()), "float32", None, None)
    seal.judge_cases(ExperimentStore(tmp_path / "o", "judge"), [case], resume=False)
    run = tmp_path / "o" / "judge"
    (attempt,) = sorted((run / "cases" / "step").iterdir())
    training = load_file(str(attempt / "score_training.safetensors"))
    assert set(training) == {"logprobs", *fields}
    assert verify_run(run).exit_code == 0
    training["selected_token_ids"] = training["selected_token_ids"].flip(1).contiguous()
    _reseal(attempt, "score_training.safetensors", save(training, metadata={"case_id": "step"}))
    damaged = [f for f in verify_run(run).findings if f.status == "damaged"]
    assert damaged and "selected_token_ids differs" in (damaged[0].reason or ""), damaged


def test_a_score_file_is_written_as_safetensors_writes_it(tmp_path: Path) -> None:
    # The payload is written from the tensors' own memory (no serialized copy): the bytes are
    # the ones safetensors' own writer gives (one metadata key: its key order is a hash map's).
    from safetensors.torch import save

    from xconf.artifacts.safe_io import publish_bytes
    from xconf.artifacts.tensor_file import tensor_parts

    g = torch.Generator().manual_seed(3)
    tensors = {
        "logprobs": -torch.rand(3, 5, generator=g),
        "token_ids": torch.randint(0, 9, (3, 5), generator=g, dtype=torch.int32),
        "selected": torch.randint(0, 9, (3, 5), generator=g),
        "active_mask": torch.ones(3, 5, dtype=torch.uint8),
        "threshold": torch.tensor(1e-5, dtype=torch.float64),
        "half": torch.rand(2, 2, generator=g).bfloat16(),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),
    }
    expected = save({k: v.contiguous() for k, v in tensors.items()}, metadata={"case_id": "c"})
    digest = publish_bytes(tmp_path, "t.safetensors", tensor_parts(tensors, {"case_id": "c"}))
    assert (tmp_path / "t.safetensors").read_bytes() == expected
    import hashlib

    assert digest == hashlib.sha256(expected).hexdigest()


@pytest.mark.parametrize(
    "dtypes", [("float32", "float32"), ("bfloat16", "float32"), ("float64", "float64")]
)
def test_a_sealed_verdict_is_the_in_memory_one_whatever_the_padding_holds(
    tmp_path: Path, dtypes: tuple[str, str]
) -> None:
    """judge_cases reuses a dump's own tensors for the token diffs; the figures it seals are
    those of the verdict that copies (padding holding NaN and -inf, IS/RS configured, verl's
    figures in the dumped dtypes), bit for bit."""
    from safetensors.torch import load_file

    from xconf.artifacts.store import ExperimentStore
    from xconf.judge.dumps import Keys, load_dump
    from xconf.judge.seal import judge_cases, resolve_dtypes, verdict
    from xconf.rollout_correction import Correction

    g = torch.Generator().manual_seed(3)
    rollout = -torch.rand(9, 31, generator=g) * 4
    training = rollout + torch.randn(9, 31, generator=g) * 1e-2
    mask = torch.rand(9, 31, generator=g) > 0.3
    rollout[~mask], training[~mask] = float("-inf"), float("nan")
    path = tmp_path / "padded.safetensors"
    save_file(
        {
            "rollout_log_probs": rollout.to(getattr(torch, dtypes[0])),
            "old_log_probs": training.to(getattr(torch, dtypes[1])),
            "response_mask": mask.to(torch.uint8),
        },
        str(path),
    )
    correction = Correction(
        rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"
    )

    # float64 dumps are judged in float64; the contract names them float32
    rollout_dtype, training_dtype = ("float32" if d == "float64" else d for d in dtypes)

    def case():
        return resolve_dtypes(
            load_dump("padded", path, Keys()), None, rollout_dtype, training_dtype, correction
        )

    copied = verdict(case())[2]
    summary = judge_cases(ExperimentStore(tmp_path / "out", "judge"), [case()])
    sealed = _comparison(tmp_path / "out" / "judge", "padded")
    assert summary.records[0].result == copied.document["result"]
    assert sealed == json.loads(json.dumps(copied.document))
    assert sealed["rollout_correction"]["weights"], sealed["rollout_correction"]
    (attempt,) = sorted((tmp_path / "out" / "judge" / "cases" / "padded").iterdir())
    stored = load_file(str(attempt / "token_diffs.safetensors"))
    assert stored.keys() == copied.token_diffs.keys()
    for name, tensor in copied.token_diffs.items():
        assert stored[name].dtype == tensor.dtype and torch.equal(stored[name], tensor), name
    # A dump judged in another dtype than it holds keeps its tensors as read through an owned
    # verdict (verl's figures in the dumped dtypes read them after it); one in the verdict
    # dtype gives them away.
    mine = case()
    given = (mine.dump.rollout.clone(), mine.dump.training.clone())
    verdict(mine, owned=True)
    kept = all(
        torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        for a, b in zip(given, (mine.dump.rollout, mine.dump.training), strict=True)
    )
    assert kept == (dtypes[0] != dtypes[1]), (dtypes, kept)
