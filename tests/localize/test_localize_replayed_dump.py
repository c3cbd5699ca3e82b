"""A replayed-dump run (`identity=from_dump`) localizes like any other (fourth campaign).

The sealed identity.json of a replayed run names its dump inside the recipe; localize read it
back as an identity that named no dump and refused the run (`localize.bad_identity`). Now
the dump is re-read (its digest checked) and frozen again to the very same identity."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.adapters.conftest import needs_hf
from tests.localize import planted
from xconf.artifacts.localization import latest
from xconf.verify import verify_run

pytestmark = needs_hf


def _dump(path: Path) -> Path:
    """planted.SAMPLES in verl's layout: prompts left-padded, responses right-padded."""
    prompts = [s.prompt_ids for s in planted.SAMPLES]
    responses = [s.response_ids for s in planted.SAMPLES]
    p, r = max(map(len, prompts)), max(map(len, responses))
    ids, attention = [], []
    for prompt, response in zip(prompts, responses, strict=True):
        left, right = [0] * (p - len(prompt)), [0] * (r - len(response))
        ids.append(left + list(prompt) + list(response) + right)
        attention.append(left + [1] * (len(prompt) + len(response)) + right)
    input_ids = torch.tensor(ids)
    tensors = {
        "input_ids": input_ids,
        "responses": input_ids[:, p:].contiguous(),
        "attention_mask": torch.tensor(attention),
    }
    save_file(tensors, str(path))
    return path


def test_a_replayed_dump_run_is_localized(model_cache, tmp_path, xconf_cli) -> None:
    from xconf.runtime.loading import instantiate_runtime, runtime_config

    doc = planted.experiment("replayed", planted.OPERATOR_CASE)
    identity = doc["identity"]
    for field in ("token_ids", "selected_token_ids", "active_mask", "attention_mask"):
        identity.pop(field)
    identity.pop("position_ids")
    identity["dump"] = str(_dump(tmp_path / "step.safetensors"))
    identity["recipe"] = {"kind": "from_dump", "model": {"arch": "qwen3", "seed": 1234}}
    summary = planted.run(doc, tmp_path / "out", instantiate_runtime(runtime_config("hf_pair")))
    run = Path(summary.experiment_dir)
    assert verify_run(run).exit_code == 0
    case = next(r.case_id for r in summary.records if r.label != "baseline")
    attempt = next((run / "cases" / case).iterdir())
    assert json.loads((attempt / "identity.json").read_text())["recipe"]["kind"] == "from_dump"
    code, _, err = xconf_cli("localize", run, case)
    assert code == 0, err[-3000:]
    stored = latest(run, case)
    assert stored is not None and stored.get("status") != "error" and stored["line"], stored
    assert verify_run(run).exit_code == 0
