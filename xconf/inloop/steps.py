"""Judge every training step, and seal a step's tensors every N steps or when it fails.

::

    from xconf.inloop import StepJudge

    judge = StepJudge("outputs/xconf-inloop", run="grpo-qwen3-8b", every=100, on_failure=True)
    verdict = judge(step, rollout_log_probs, old_log_probs, response_mask,
                    rollout_dtype="bfloat16", training_dtype="float32",
                    input_ids=batch["input_ids"], responses=batch["responses"],
                    attention_mask=batch["attention_mask"])

A sealed step is a safetensors dump in verl's layout (``<root>/<run>-dumps/step-N``),
judged and sealed by ``xconf judge``'s own code into its own experiment
(``<root>/<run>-step-N``), so ``xconf verify``, ``xconf report`` and, when the token ids
were given, the replay ``xconf-run ... identity=from_dump identity.dump=<dump>`` work on it.
The dump is written once and never overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from xconf.inloop.api import (
    BatchVerdict,
    InloopError,
    check_tensors,
    host_tensor,
    inloop_errors,
    judge_batch,
)

if TYPE_CHECKING:
    from xconf.rollout_correction import Correction

# verl's batch keys: judge and identity=from_dump read them without renames.
TOKEN_KEYS = ("input_ids", "prompts", "responses", "attention_mask", "position_ids")


def _dump_tensors(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor, tokens: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """The step's tensors as its dump holds them (verl's keys), checked as tensors."""
    tensors = {
        "rollout_log_probs": rollout,
        "old_log_probs": training,
        "response_mask": mask.to(torch.uint8),
    }
    for key, value in tokens.items():
        if value is None:
            continue
        tensor = host_tensor(value, key)
        if tensor.is_floating_point() or tensor.is_complex():
            raise InloopError("inloop.not_integer", f"{key} holds {tensor.dtype}, not ids", key)
        tensors[key] = tensor.to(torch.int64)
    return tensors


@inloop_errors("seal_step")
def seal_step(
    root: str | Path,
    run: str,
    step: int,
    rollout_log_probs: Any,
    old_log_probs: Any,
    response_mask: Any,
    *,
    rollout_dtype: str,
    training_dtype: str,
    correction: Correction | None = None,
    **tokens: Any,
) -> Path:
    """Write the step's dump and judge it as ``xconf judge`` does; returns the experiment dir.

    Everything is checked before a byte is written (the tensors, the token ids against each
    other as judge reads them, the dtypes): a step that cannot be judged leaves nothing
    behind. Whatever goes wrong is an :class:`InloopError`."""
    from safetensors.torch import save

    from xconf.artifacts.safe_io import ensure_real_dir, publish_bytes
    from xconf.artifacts.store import ExperimentStore
    from xconf.judge.dumps import Keys, dump_of, load_dump
    from xconf.judge.formats import Column, Parsed
    from xconf.judge.seal import judge_cases, resolve_dtypes

    unknown = sorted(set(tokens) - set(TOKEN_KEYS))
    if unknown:
        raise InloopError(
            "inloop.unknown_key", f"unknown token keys {unknown} (known: {TOKEN_KEYS})", unknown[0]
        )
    rollout, training, mask = check_tensors(rollout_log_probs, old_log_probs, response_mask)
    name = f"step-{int(step):08d}"
    tensors = _dump_tensors(rollout, training, mask, tokens)
    metadata = {"rollout_dtype": rollout_dtype, "training_dtype": training_dtype}
    columns = {k: Column(v) for k, v in tensors.items()}
    unsealed = Parsed("unsealed", 0, columns, metadata, frozenset(tensors))
    resolve_dtypes(dump_of(name, Path(name), unsealed, Keys()), None, rollout_dtype, training_dtype)
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    dumps = ensure_real_dir(Path(root), f"{run}-dumps")
    publish_bytes(dumps, f"{name}.safetensors", data)
    dump = load_dump(name, dumps / f"{name}.safetensors", Keys())
    case = resolve_dtypes(dump, None, rollout_dtype, training_dtype, correction)
    store = ExperimentStore(root, f"{run}-{name}")
    judge_cases(store, [case])
    return store.path


class StepJudge:
    """:func:`judge_batch` on every call; a sealed dump every ``every`` steps (0: never)
    and, with ``on_failure``, whenever the verdict is not ``pass``."""

    @inloop_errors("StepJudge")
    def __init__(
        self, root: str | Path, *, run: str = "inloop", every: int = 0, on_failure: bool = True
    ) -> None:
        from xconf.experiment import is_safe_id

        if not isinstance(run, str) or not is_safe_id(run):
            raise InloopError("inloop.bad_run", f"run {run!r} is not a safe id", "run")
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise InloopError("inloop.bad_every", "every is 0 (never) or a step count", "every")
        self.root = Path(root)
        self.run = run
        self.every = every
        self.on_failure = on_failure

    @inloop_errors("StepJudge")
    def __call__(
        self,
        step: int,
        rollout_log_probs: Any,
        old_log_probs: Any,
        response_mask: Any,
        *,
        rollout_dtype: str,
        training_dtype: str,
        correction: Correction | None = None,
        **tokens: Any,
    ) -> BatchVerdict:
        verdict = judge_batch(
            rollout_log_probs,
            old_log_probs,
            response_mask,
            rollout_dtype=rollout_dtype,
            training_dtype=training_dtype,
            correction=correction,
        )
        due = self.every > 0 and step % self.every == 0
        if due or (self.on_failure and not verdict.passed):
            sealed = seal_step(
                self.root,
                self.run,
                step,
                rollout_log_probs,
                old_log_probs,
                response_mask,
                rollout_dtype=rollout_dtype,
                training_dtype=training_dtype,
                correction=correction,
                **tokens,
            )
            verdict = replace(verdict, dump=str(sealed))
        return verdict
