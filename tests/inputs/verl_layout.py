"""A sealed xconf attempt rewritten in verl's batch layout, as a training step would dump it.

verl (``DataProto.batch``): ``prompts`` [B, P] left-padded, ``responses`` [B, R]
right-padded, ``input_ids`` their concatenation, ``attention_mask``, ``position_ids``
(the prompt's cumulative positions, then the response's counting on through the padding,
as verl's vLLM rollout builds them), ``response_mask``, and the per-response-token
``rollout_log_probs`` / ``old_log_probs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def verl_tensors(attempt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    identity = json.loads((attempt / "identity.json").read_text())
    pad = int(identity["packing_metadata"]["pad_token_id"])
    roll = load_file(str(attempt / "score_rollout.safetensors"))["logprobs"]
    train = load_file(str(attempt / "score_training.safetensors"))["logprobs"]
    rows = []
    for b, ids in enumerate(identity["token_ids"]):
        length = sum(identity["attention_mask"][b])
        first = identity["active_mask"][b].index(1)
        span = slice(first, length - 1)  # core position t scores token t + 1
        rows.append((ids[: first + 1], ids[first + 1 : length], roll[b, span], train[b, span]))
    width_p = max(len(p) for p, *_ in rows)
    width_r = max(len(r) for _, r, *_ in rows)
    batch = len(rows)
    prompts = torch.full((batch, width_p), pad, dtype=torch.int64)
    responses = torch.full((batch, width_r), pad, dtype=torch.int64)
    attention = torch.zeros((batch, width_p + width_r), dtype=torch.int64)
    rollout = torch.zeros((batch, width_r), dtype=torch.float32)
    training = torch.zeros((batch, width_r), dtype=torch.float32)
    for b, (p, r, lr, lt) in enumerate(rows):
        prompts[b, width_p - len(p) :] = torch.tensor(p)
        responses[b, : len(r)] = torch.tensor(r)
        attention[b, width_p - len(p) : width_p + len(r)] = 1
        rollout[b, : len(r)] = lr
        training[b, : len(r)] = lt
    prompt_pos = torch.clip(torch.cumsum(attention[:, :width_p], dim=-1) - 1, min=0)
    response_pos = prompt_pos[:, -1:] + torch.arange(1, width_r + 1)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
        "response_mask": attention[:, width_p:].clone(),
        "rollout_log_probs": rollout,
        "old_log_probs": training,
    }


def planted_drift(tensors: dict[str, torch.Tensor], nats: float = 0.5) -> dict[str, torch.Tensor]:
    """A copy of a dump with one planted mismatch, whatever the CPU's kernels gave: the first
    active token's ``old_log_probs`` lowered by ``nats`` (still a log-probability, <= 0), ten
    times the loosest contract threshold, so that token fails on any machine."""
    out = {name: t.clone() for name, t in tensors.items()}
    b, t = (int(i) for i in torch.nonzero(out["response_mask"])[0])
    out["old_log_probs"][b, t] -= nats
    return out
