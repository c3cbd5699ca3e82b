"""Child of ``test_verl_referee.py``: verl 0.9.1's own figures for a grid of dumps.

Run with ``.cache/verl-site`` on ``PYTHONPATH`` (verl installed there, never in the venv):
``python verl_referee_child.py GRID.safetensors CONFIGS.json`` prints one JSON object, per
case the figures verl logs, every float as ``float.hex`` (bit for bit; inf and NaN too).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from safetensors.torch import load_file
from verl.protocol import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.utils.debug.metrics import calculate_debug_metrics


def _hex(value: Any) -> str:
    return float(value).hex()


def figures(r: torch.Tensor, t: torch.Tensor, m: torch.Tensor, config: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    if bool(m.bool().any()):  # verl asserts an active token for its rollout_corr/ figures
        try:
            _, _, metrics = compute_rollout_correction_and_rejection_mask(
                old_log_prob=t, rollout_log_prob=r, response_mask=m, **config
            )
        except ZeroDivisionError:  # its effective sample size when every IS weight is 0
            out["raised"] = "ZeroDivisionError"
            _, _, metrics = compute_rollout_correction_and_rejection_mask(
                old_log_prob=t, rollout_log_prob=r, response_mask=m
            )
        out.update({k: _hex(v) for k, v in metrics.items()})
    batch = DataProto.from_dict(
        tensors={
            "rollout_log_probs": r,
            "old_log_probs": t,
            "response_mask": m,
            "responses": torch.zeros_like(m, dtype=torch.int64),
        }
    )
    out.update({k: _hex(v) for k, v in calculate_debug_metrics(batch).items()})
    return out


def main() -> None:
    tensors = load_file(sys.argv[1])
    with open(sys.argv[2]) as fh:
        cases = json.load(fh)
    result = {}
    for case in cases:
        name = case["name"]
        r, t, m = (tensors[f"{name}.{k}"] for k in ("r", "t", "m"))
        result[name] = figures(r, t, m, case["config"])
    import verl

    print(json.dumps({"verl": verl.__version__, "cases": result}))


if __name__ == "__main__":
    main()
