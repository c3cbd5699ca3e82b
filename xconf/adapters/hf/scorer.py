"""Training-side teacher-forced scoring of frozen tokens with a transformers model.

Read-only by construction and by check: ``torch.no_grad``, eval mode during the forward
and every module's original mode restored afterwards, ``use_cache=False``, and the
rank-local digests of all parameters and buffers compared before and after. The selected
logprob is the native fp32 ``log_softmax`` + ``gather`` or an injected operator
``op(logits[N, V], target_ids[N], active_mask[N]) -> float32[N]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xconf.adapters.errors import ScoringError
from xconf.adapters.frozen import FrozenBatch, VocabRows, assemble_scores
from xconf.adapters.hf.align.apply import ArmCount, arm_counts, decode_ready
from xconf.adapters.hf.head import HeadDtypes, Temperature, install_float32_head
from xconf.adapters.hf.layout import lay_out
from xconf.adapters.hf.model import (
    ModelState,
    TrainingScorerConfig,
    apply_fsdp2,
    load_model,
    mixed_precision,
    model_state,
    normalize_sharding,
    reshard,
)
from xconf.adapters.hf.readonly import (
    StateDigest,
    check_unchanged,
    mode_snapshot,
    restore_modes,
    state_digest,
)
from xconf.adapters.hf.shaped import Shaping
from xconf.knobs import LOGITS_FLOAT32, LOGP_BACKEND
from xconf.runtime.readback import (
    TRAINING_ARM_MODULES,
    TRAINING_FORWARD_TOKENS,
    TRAINING_REQUEST_SIZES,
    TRAINING_STATE_DIGEST,
)

SelectedLogprobOp = Callable[[Any, Any, Any], Any]


def native_selected_logprob(logits: Any, target_ids: Any, active_mask: Any) -> Any:
    """fp32 log_softmax over the vocabulary, then the target's entry."""
    logp = logits.float().log_softmax(dim=-1)
    return logp.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)


def _selected(op: SelectedLogprobOp, logits: Any, targets: Any, active: Any) -> Any:
    import torch

    out = op(logits, targets, active)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
        raise ScoringError(
            "operator_output", "selected-logprob operator must return float32", LOGP_BACKEND.path
        )
    if tuple(out.shape) != (targets.shape[0],):
        raise ScoringError(
            "operator_output",
            f"operator returned shape {tuple(out.shape)}, expected ({targets.shape[0]},)",
            LOGP_BACKEND.path,
        )
    return out


@dataclass(frozen=True)
class TrainingScore:
    """Selected logprobs [B, T] (core layout) and the read-only evidence of the pass."""

    logprobs: Any
    digest_before: StateDigest
    digest_after: StateDigest
    mode_restored: bool
    request_sizes: tuple[int, ...]
    layouts: tuple[str, ...] = ()  # "padded" or "packed", per request
    forward_tokens: tuple[tuple[int, ...], ...] = ()  # per request: tokens of each forward


def _scored(samples: list[Any], pad_token_id: int, packed: bool) -> tuple[Any, Any, Any, Any, Any]:
    """The request laid out (``layout.lay_out``), and the (row, column) of every scored token:
    column ``c + t`` of a sample's row predicts its token ``t + 1`` (teacher forcing)."""
    import torch

    laid = lay_out([s.token_ids for s in samples], pad_token_id, packed)
    rows = torch.cat([torch.full((s.length - 1,), laid.rows[r]) for r, s in enumerate(samples)])
    cols = torch.cat(
        [torch.arange(laid.cols[r], laid.cols[r] + s.length - 1) for r, s in enumerate(samples)]
    )
    return laid.ids, laid.mask, laid.positions, rows, cols


def teacher_forced_scores(
    model: Any,
    batch: FrozenBatch,
    batch_size: int,
    op: SelectedLogprobOp | None = None,
    remove_padding: bool = False,
    shaping: Shaping | None = None,
    vocab_rows: VocabRows | None = None,
) -> TrainingScore:
    """Score every frozen sample (chunks of ``batch_size``) and verify the model is untouched.

    ``shaping``: the model carries the forwards of arms or of the decode mode, which
    ``shaped.Shaping`` drives (None: one plain teacher-forced forward per request).
    ``vocab_rows``: where a plain pass keeps the logits rows of the active tokens (a shaped
    pass keeps none: its rows are the arms', position by position)."""
    import torch

    native = op is None
    op = op or native_selected_logprob
    device = next(model.parameters()).device
    before = state_digest(model)
    modes = mode_snapshot(model)
    per_sample: list[dict[int, float]] = [{} for _ in batch.samples]
    sizes: list[int] = []
    layouts: list[str] = []
    tokens: list[tuple[int, ...]] = []
    try:
        model.eval()
        with torch.no_grad():
            for chunk in batch.chunks(batch_size):
                samples = [batch.samples[i] for i in chunk]
                sizes.append(len(samples))
                layouts.append("packed" if remove_padding else "padded")
                if shaping is not None:
                    scored = shaping.chunk(
                        model,
                        samples,
                        batch.pad_token_id,
                        lambda logits, targets, active: _selected(op, logits, targets, active),
                        native,
                        remove_padding,
                    )
                    for i, values in zip(chunk, scored.values, strict=True):
                        per_sample[i] = values
                    tokens.append(scored.forward_tokens)
                    continue
                ids, attn, pos, rows, cols = _scored(samples, batch.pad_token_id, remove_padding)
                # The scored token's index inside its own sample, and whether it is a response.
                offsets = torch.tensor(
                    [t for s in samples for t in range(s.length - 1)], dtype=torch.long
                )
                prompt = torch.cat(
                    [torch.full((s.length - 1,), len(s.prompt_ids) - 1) for s in samples]
                )
                active = offsets >= prompt
                tokens.append((int(ids.numel()),))
                out = model(
                    input_ids=ids.to(device),
                    attention_mask=None if attn is None else attn.to(device),
                    position_ids=pos.to(device),
                    use_cache=False,
                )
                # column t predicts token t + 1 (teacher forcing of the frozen sequence)
                flat_logits = out.logits[rows.to(device), cols.to(device), :]
                targets = ids[rows, cols + 1].to(device)
                selected = _selected(op, flat_logits, targets, active.to(device)).cpu()
                sample_of = torch.cat(
                    [torch.full((s.length - 1,), r) for r, s in enumerate(samples)]
                )
                for k in range(selected.shape[0]):
                    per_sample[chunk[int(sample_of[k])]][int(offsets[k])] = float(selected[k])
                if vocab_rows is not None:
                    kept = flat_logits[active.to(device)].detach().to("cpu", torch.float32)
                    owners, where = sample_of[active], offsets[active]
                    for r in range(len(samples)):
                        mine = owners == r
                        vocab_rows.keep(chunk[r], where[mine].tolist(), kept[mine])
    finally:
        reshard(model)
        restore_modes(model, modes)
    after = state_digest(model)
    check_unchanged(before, after, "training.model")
    return TrainingScore(
        logprobs=assemble_scores(batch, per_sample, side="training"),
        digest_before=before,
        digest_after=after,
        mode_restored=mode_snapshot(model) == modes,
        request_sizes=tuple(sizes),
        layouts=tuple(layouts),
        forward_tokens=tuple(tokens),
    )


@dataclass(frozen=True)
class ScorerState:
    """A training scorer's live state, which the training handlers read each knob from."""

    model: ModelState
    state_digest: dict[str, Any]  # the parameters and buffers after scoring
    request_sizes: tuple[int, ...]  # samples per forward, per request of the last call
    requested_batch_size: int | None  # the batch size the last call asked for
    layouts: tuple[str, ...]  # per request: ``packed`` (one row) or ``padded`` (a batch)
    arms: tuple[ArmCount, ...] = ()  # per kind: modules computing as vLLM, of the model's
    scoring_modes: tuple[str, ...] = ()  # per request of the last call: ``full`` or ``decode``
    decode_ready: bool = False  # every attention module runs the decode mode's forward
    forward_tokens: tuple[tuple[int, ...], ...] = ()
    logits_dtype: str | None = None  # the head's outputs in the last call (``head.py``)
    temperature: float | None = None  # what the last call's logits were divided by

    def readings(self) -> dict[str, Any]:
        """What the scorer reports beside its knobs (``runtime/readback`` names)."""
        return {
            **self.model.readings,
            TRAINING_STATE_DIGEST.name: self.state_digest,
            TRAINING_REQUEST_SIZES.name: list(self.request_sizes),
            TRAINING_ARM_MODULES.name: ", ".join(a.text() for a in self.arms),
            TRAINING_FORWARD_TOKENS.name: _tokens_text(self.forward_tokens),
        }


def _tokens_text(per_request: tuple[tuple[int, ...], ...]) -> str:
    """``582+95x4; 588+95x4`` (a request's forwards; a run of equal ones as ``count x n``)."""

    def runs(tokens: tuple[int, ...]) -> str:
        parts: list[str] = []
        i = 0
        while i < len(tokens):
            j = i
            while j < len(tokens) and tokens[j] == tokens[i]:
                j += 1
            parts.append(str(tokens[i]) if j - i == 1 else f"{j - i}x{tokens[i]}")
            i = j
        return "+".join(parts)

    return "; ".join(runs(t) for t in per_request)


class HFTrainingScorer:
    """A transformers model built for one :class:`TrainingScorerConfig`, scored read-only."""

    def __init__(self, cfg: TrainingScorerConfig, group: Any = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.model = load_model(cfg)
        self.sharding = normalize_sharding(cfg.sharding)
        self.distributed: dict[str, Any] = {}
        self.last_request_size: int | None = None
        self.request_sizes: list[int] = []
        self.layouts: list[str] = []
        self.scoring_modes: list[str] = []
        self.forward_tokens: list[tuple[int, ...]] = []
        if self.sharding == "fsdp":
            policy = mixed_precision(cfg.param_dtype, cfg.reduce_dtype)
            self.distributed = apply_fsdp2(self.model, cfg.device, group, policy)
        decode = cfg.scoring_mode == "decode"
        self.shaping: Shaping | None = None
        if cfg.align or decode:
            from xconf.adapters.hf.align.apply import install

            install(self.model, cfg.align, decode, cfg.device)
            self.shaping = Shaping(frozenset(cfg.align), decode)
        if cfg.logits_dtype == LOGITS_FLOAT32:
            install_float32_head(self.model)
        self.head_dtypes = HeadDtypes(self.model)
        self.temperature = Temperature(self.model, cfg.temperature)

    def score(
        self,
        batch: FrozenBatch,
        batch_size: int,
        op: SelectedLogprobOp | None = None,
        vocab_rows: VocabRows | None = None,
    ) -> TrainingScore:
        self.head_dtypes.clear()
        self.temperature.clear()
        score = teacher_forced_scores(
            self.model, batch, batch_size, op, self.cfg.remove_padding, self.shaping, vocab_rows
        )
        self.last_request_size = batch_size
        self.request_sizes = list(score.request_sizes)
        self.layouts = list(score.layouts)
        mode = "decode" if self.shaping is not None and self.shaping.decode else "full"
        self.scoring_modes = [mode] * len(score.request_sizes)
        self.forward_tokens = list(score.forward_tokens)
        return score

    @property
    def uses_kv_cache(self) -> bool:
        """The decode mode attends over each sample's KV cache; a full forward has none."""
        return self.shaping is not None and self.shaping.decode

    def live(self) -> ScorerState:
        """The scorer's live state: its model as it is now and the forwards it ran."""
        return ScorerState(
            model_state(self.model),
            state_digest(self.model).to_dict(),
            tuple(self.request_sizes),
            self.last_request_size,
            tuple(self.layouts),
            arm_counts(self.model),
            tuple(self.scoring_modes),
            decode_ready(self.model),
            tuple(self.forward_tokens),
            self.head_dtypes.reading(),
            self.temperature.reading(),
        )
