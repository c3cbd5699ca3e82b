"""A checkpoint replaced under a run: cases whose engines load it afterwards are refused."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.inputs.test_real_inputs_e2e import _spec
from xconf.experiment import Intervention


def test_checkpoint_changed_mid_run_refuses_later_engines(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from xconf.adapters.checkpoint.runtime import CheckpointRuntime
    from xconf.adapters.frozen import FrozenBatch, FrozenSample, build_identity
    from xconf.session import prepare, run_prepared

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["llama"], ckpt)
    runtime = CheckpointRuntime(
        "hf", "hf", kind="hf-pair", model={"path": str(ckpt)}, model_cache=str(tmp_path / "cache")
    )
    record = runtime._local_record
    assert record is not None
    # An already frozen identity: no vLLM freeze, transformers on both sides.
    batch = FrozenBatch((FrozenSample((5, 6, 7), (8, 9, 10, 11)), FrozenSample((12,), (13, 14))), 0)
    identity = build_identity(
        batch,
        checkpoint_id=f"sha256:{record.checkpoint_sha256}",
        model_version=record.model_version,
        tokenizer_id=record.tokenizer_id,
        pre_update_state="as saved",
        scoring_mode="decode",
        recipe={},
    )
    # The S1 experiment (the one hf_pair runs), unsharded: no launcher needed.
    spec, _ = _spec("s1_cpu_fsdp", "hf_pair", ["training.sharding=unsharded"])
    spec = replace(
        spec,
        identity=identity,
        interventions=(Intervention("rollout.dtype", ("bfloat16",)),),
    )
    prepared = prepare(
        spec, output_root=tmp_path / "out", allow_smoke_operators=False, device="cpu"
    )

    def replace_weights(record_: Any) -> None:  # another process rewrites the checkpoint
        cfg = ckpt / "generation_config.json"
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "eos_token_id": 3}))

    summary = run_prepared(prepared, runtime, resume=False, on_case=replace_weights)
    first, second = summary.records
    assert first.result == "pass", first
    # An identity violation (invalid_identity once adapters' violations are classified so;
    # never a verdict on drift).
    assert second.result in ("invalid_identity", "error"), second
    attempt = Path(summary.experiment_dir) / "cases" / second.case_id / second.attempt_id
    doc = json.loads((attempt / "comparison.json").read_text())
    assert "identity.checkpoint_changed" in json.dumps(doc)
