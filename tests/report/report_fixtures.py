"""Write realistic run directories in the documented ``xconf.artifacts.v1`` format.

The writer follows docs/artifacts.md literally (JSON and safetensors, a COMPLETE seal with
the sha256 of every payload) so the report is tested against the format, not the
producer's code.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from xconf.artifacts.plan_seal import plan_bytes, plan_digest

THRESHOLDS = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 5e-2}
PRECISION = ("float32", "float16", "bfloat16")
CONTRACT = {"version": "2026.11.0", "sha256": hashlib.sha256(b"contract").hexdigest()}
BASE_KNOBS: dict[str, Any] = {
    "batch.size": 2,
    "rollout.tensor_parallel_size": 1,
    "rollout.context_parallel_size": 1,
    "training.sharding": "none",
    "rollout.dtype": "float32",
    "rollout.enable_prefix_caching": False,
    "rollout.enforce_eager": True,
    "training.attention_backend": "sdpa",
    "training.compute_dtype": "float32",
    "logp.backend": "native",
}
LIFECYCLE = {"batch.size": "request", "rollout.tensor_parallel_size": "process"}


@dataclass
class CaseSpec:
    """One case: the knobs it changes, the two sides' logprobs, and its attempts."""

    changed: dict[str, Any]
    rollout: np.ndarray
    training: np.ndarray
    active: np.ndarray
    rollout_dtype: str = "float32"
    training_dtype: str = "float32"
    # each attempt: "ok", "tampered" (payload edited after sealing), "partial" (no COMPLETE),
    # "error" (sealed error result)
    attempts: Sequence[str] = ("ok",)
    kind: str = "one_at_a_time"
    statuses: dict[str, str] = field(default_factory=dict)


def case_id_for(changed: dict[str, Any]) -> str:
    blob = json.dumps(changed, sort_keys=True).encode()
    return "c-" + hashlib.sha256(blob).hexdigest()[:16]


def threshold_for(rollout: str, training: str) -> tuple[float, str, str]:
    if rollout == training:
        return THRESHOLDS[rollout], rollout, "same_dtype"
    worse = max(rollout, training, key=PRECISION.index)
    return THRESHOLDS[worse], worse, "less_precise_dtype"


def compare(spec: CaseSpec, case_id: str, attempt_id: str) -> tuple[dict[str, Any], dict]:
    """The verdict by the contract's rule, computed here independently of xconf (numpy), and
    the token-diff tensors."""
    threshold, dtype, rule = threshold_for(spec.rollout_dtype, spec.training_dtype)
    rollout = spec.rollout.astype(np.float32)
    training = spec.training.astype(np.float32)
    active = spec.active.astype(bool)
    abs_diff = np.abs(training.astype(np.float64) - rollout.astype(np.float64)).astype(np.float32)
    mismatch = active & (abs_diff > threshold)
    values = abs_diff[active].astype(np.float64)
    n = int(values.size)
    comparison: dict[str, Any] = {
        "schema": "xconf.comparison.v1",
        "case_id": case_id,
        "attempt_id": attempt_id,
        "threshold": threshold,
        "threshold_dtype": dtype,
        "threshold_rule": rule,
        "contract": CONTRACT,
        "rollout_dtype": spec.rollout_dtype,
        "training_dtype": spec.training_dtype,
        "active_tokens": n,
        "mismatches": int(mismatch.sum()),
        "mismatch_ratio": float(mismatch.sum() / n) if n else 0.0,
        "reason": None,
        "error": None,
        "identity": {"valid": True, "violations": []},
    }
    if n == 0:
        comparison.update(result="zero_active_tokens", reason="no active selected token")
        comparison.update(diff=None, approx_kl=None, worst_token=None, drift_profile=[])
    else:
        p50, p90, p99 = np.quantile(values, [0.5, 0.9, 0.99])
        d = (training.astype(np.float64) - rollout.astype(np.float64))[active]
        b, t = np.unravel_index(int(np.argmax(np.where(active, abs_diff, -1.0))), abs_diff.shape)
        comparison.update(
            result="fail" if mismatch.any() else "pass",
            diff={
                "mean": float(values.mean()),
                "p50": float(p50),
                "p90": float(p90),
                "p99": float(p99),
                "max": float(values.max()),
            },
            approx_kl=float(np.mean(np.exp(d) - d - 1)),
            worst_token={
                "batch": int(b),
                "position": int(t),
                "token_id": int(100 + t),
                "rollout_logprob": float(rollout[b, t]),
                "training_logprob": float(training[b, t]),
            },
            drift_profile=[
                {
                    "position": pos,
                    "active": int(active[:, pos].sum()),
                    "mean_abs_diff": float(abs_diff[:, pos][active[:, pos]].mean()),
                    "max_abs_diff": float(abs_diff[:, pos][active[:, pos]].max()),
                }
                for pos in range(abs_diff.shape[1])
                if active[:, pos].any()
            ],
        )
    tensors = {
        "rollout_logprobs": torch.from_numpy(rollout),
        "training_logprobs": torch.from_numpy(training),
        "active_mask": torch.from_numpy(active.astype(np.uint8)),
        "abs_diff": torch.from_numpy(abs_diff),
        "mismatch_mask": torch.from_numpy(mismatch.astype(np.uint8)),
        "threshold": torch.tensor(threshold, dtype=torch.float32),
    }
    return comparison, tensors


def _dump(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=1, sort_keys=True), encoding="utf-8")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _applications(
    knobs: dict[str, Any], side: str, statuses: dict[str, str], readback: bool
) -> list:
    """KnobApplication.to_dict() records, as xconf.runtime.protocol writes them."""
    return [
        {
            "path": path,
            "side": side,
            "lifecycle": LIFECYCLE.get(path, "engine_construction"),
            "requested": value,
            "materialized": value,
            "actual": value if readback else None,
            "status": statuses.get(path, "applied"),
            "evidence": f"{'engine readback' if readback else 'constructor argument'}: {value}",
        }
        for path, value in sorted(knobs.items())
    ]


def write_attempt(
    exp_dir: Path,
    experiment_id: str,
    spec: CaseSpec,
    case_id: str,
    attempt_id: str,
    mode: str,
    tokenizer_id: str,
) -> Path:
    directory = exp_dir / "cases" / case_id / attempt_id
    directory.mkdir(parents=True)
    knobs = {**BASE_KNOBS, **spec.changed}
    comparison, tensors = compare(spec, case_id, attempt_id)
    if mode == "error":  # as comparison.error_outcome writes it: no numbers, no tensors
        comparison.update(
            result="error",
            reason="engine construction failed",
            error={
                "code": "runtime.engine_failed",
                "path": "rollout",
                "message": "engine construction failed",
            },
            active_tokens=0,
            mismatches=0,
            mismatch_ratio=0.0,
            diff=None,
            approx_kl=None,
            worst_token=None,
            drift_profile=[],
        )
        tensors = {}
    operators = {"rollout": knobs["logp.backend"], "training": knobs["logp.backend"]}
    _dump(
        directory / "requested.json",
        {"case_id": case_id, "knobs": knobs, "changed": spec.changed, "operators": operators},
    )
    sides = ("rollout", "training")
    dtypes = {"rollout": spec.rollout_dtype, "training": spec.training_dtype}
    _dump(
        directory / "materialized.json",
        {
            "runtime_kind": "cpu_smoke",
            "case_id": case_id,
            "scorers": {"rollout": "cpu_smoke.decode@1", "training": "cpu_smoke.teacher@1"},
            "sides": {
                side: {
                    "side": side,
                    "dtype": dtypes[side],
                    "knobs": _applications(knobs, side, spec.statuses, False),
                    "distributed_context": {"world_size": 1},
                    "fingerprints": {
                        "construction": "f" * 16,
                        "distributed_context": "e" * 16,
                        "process": "d" * 16,
                    },
                }
                for side in sides
            },
        },
    )
    _dump(
        directory / "actual.json",
        {
            "sides": {side: _applications(knobs, side, spec.statuses, True) for side in sides},
            "operator_provenance": [],
        },
    )
    _dump(
        directory / "identity.json",
        {
            "sha256": "d" * 64,
            "checkpoint_id": "tiny-ckpt",
            "model_version": "1",
            "tokenizer_id": tokenizer_id,
            "tokenizer_policy": "frozen",
        },
    )
    batch, length = spec.rollout.shape
    token_ids = torch.arange(batch * length, dtype=torch.int64).reshape(batch, length) % 50 + 3
    for side, values in (("rollout", spec.rollout), ("training", spec.training)):
        score = {
            "logprobs": torch.from_numpy(values.astype(np.float32)),
            "token_ids": token_ids,
            "selected_token_ids": token_ids + 1,
            "active_mask": torch.from_numpy(spec.active.astype(np.uint8)),
        }
        save_file(score if mode != "error" else {}, str(directory / f"score_{side}.safetensors"))
    save_file(tensors, str(directory / "token_diffs.safetensors"))
    _dump(directory / "comparison.json", comparison)
    if mode == "partial":
        return directory
    files = {p.name: _sha(p) for p in sorted(directory.iterdir())}
    _dump(
        directory / "COMPLETE",
        {
            "schema": "xconf.seal.v1",
            "experiment_id": experiment_id,
            "case_id": case_id,
            "attempt_id": attempt_id,
            "execution_key": hashlib.sha256(case_id.encode()).hexdigest(),
            "result": comparison["result"],
            "files": files,
        },
    )
    if mode == "tampered":  # edited after sealing: claims a pass it never earned
        comparison.update(
            result="pass", mismatches=0, mismatch_ratio=0.0, reason="edited after sealing"
        )
        _dump(directory / "comparison.json", comparison)
    return directory


def write_run(
    root: Path, experiment_id: str, specs: Sequence[CaseSpec], tokenizer_id: str = "tiny-tokenizer"
) -> Path:
    exp_dir = root / experiment_id
    exp_dir.mkdir(parents=True)
    rows = []
    for index, spec in enumerate(specs):
        case_id = case_id_for(spec.changed)
        rows.append(
            {
                "case_id": case_id,
                "index": index,
                "kind": spec.kind,
                "changed": spec.changed,
                "knobs": {**BASE_KNOBS, **spec.changed},
                "operators": {"rollout": "native", "training": "native"},
            }
        )
        for number, mode in enumerate(spec.attempts, start=1):
            write_attempt(
                exp_dir, experiment_id, spec, case_id, f"a-{number:04d}", mode, tokenizer_id
            )
    data = plan_bytes(rows)
    (exp_dir / "plan.jsonl").write_bytes(data)
    _dump(  # sealed like the store seals it: experiment.json holds the plan's digest
        exp_dir / "experiment.json",
        {
            "schema": "xconf.experiment.v1",
            "experiment_id": experiment_id,
            "scenario_id": "S0",
            "strategy": "one_at_a_time",
            "contract": CONTRACT,
            "baseline": BASE_KNOBS,
            "plan_sha256": plan_digest(data),
        },
    )
    return exp_dir


def logprobs(batch: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return -rng.gamma(2.0, 1.2, size=(batch, length)).astype(np.float32)


def standard_specs() -> list[CaseSpec]:
    """Baseline pass, two failures of different severity, zero active tokens,
    a case whose newest attempt was tampered, one never sealed, one sealed error."""
    batch, length = 2, 24
    base = logprobs(batch, length, 0)
    active = np.ones((batch, length), dtype=bool)
    active[1, 20:] = False  # padding
    rng = np.random.default_rng(1)
    tiny = rng.normal(0, 2e-7, size=base.shape).astype(np.float32)
    bf16 = rng.normal(0, 2e-2, size=base.shape).astype(np.float32)
    bf16[0, 5], bf16[0, 17], bf16[1, 9] = 0.21, -0.08, 0.06  # three tokens past 5e-2
    offset = np.full(base.shape, 1e-3, dtype=np.float32) + tiny
    return [
        CaseSpec({}, base, base + tiny, active, kind="baseline"),
        CaseSpec(
            {"rollout.dtype": "bfloat16"},
            base,
            base + bf16,
            active,
            rollout_dtype="bfloat16",
            statuses={"rollout.dtype": "applied"},
        ),
        CaseSpec({"logp.backend": "smoke_only.logp_offset"}, base, base + offset, active),
        CaseSpec({"batch.size": 8}, base, base + tiny, np.zeros_like(active)),
        CaseSpec(
            {"rollout.enforce_eager": False},
            base,
            base + tiny * 3,
            active,
            attempts=("ok", "tampered"),
        ),
        CaseSpec(
            {"training.attention_backend": "eager"},
            base,
            base + bf16,
            active,
            attempts=("tampered",),
        ),
        CaseSpec(
            {"rollout.enable_prefix_caching": True},
            base,
            base + tiny,
            active,
            attempts=("partial",),
        ),
        CaseSpec(
            {"training.sharding": "fsdp"},
            base,
            base + tiny,
            active,
            attempts=("error",),
            statuses={"training.sharding": "error"},
        ),
    ]
