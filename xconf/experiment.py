"""Immutable, versioned domain records shared by planning, execution and artifacts."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from xconf.canonical import canonical_digest
from xconf.knobs import KnobValue

EXPERIMENT_SCHEMA_V1 = "cross_config.experiment_config.v1"
# v2: the v1 shape, plus the extended knobs of xconf.knobs (docs/experiment-v2.md).
EXPERIMENT_SCHEMA_V2 = "cross_config.experiment_config.v2"
PLAN_SCHEMA = "xconf.plan.v1"
# Always used with fullmatch: ``$`` alone would accept a trailing newline.
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

Strategy = Literal["one_at_a_time", "pairwise"]
# "fix": a case the fix search added to a finished run (xconf.fix), sealed as a plan extension.
CaseKind = Literal["baseline", "one_at_a_time", "pairwise", "fix"]
ScoringMode = Literal["decode", "prefill"]


def is_safe_id(value: str) -> bool:
    return bool(SAFE_ID.fullmatch(value)) and value not in {".", ".."} and ".." not in value


@dataclass(frozen=True)
class Identity:
    """The frozen logical input both sides must score.

    Token-level fields are row-major tuples (one row per sample). ``recipe`` names how a
    runtime freezes the identity when tokens are produced by a baseline rollout; for such
    identities the token fields are empty until frozen.
    """

    checkpoint_id: str
    model_version: str
    tokenizer_id: str
    tokenizer_policy: str
    token_ids: tuple[tuple[int, ...], ...]
    selected_token_ids: tuple[tuple[int, ...], ...]
    active_mask: tuple[tuple[int, ...], ...]
    attention_mask: tuple[tuple[int, ...], ...]
    position_ids: tuple[tuple[int, ...], ...]
    pre_update_state: str
    cache_metadata: str  # canonical JSON
    packing_metadata: str  # canonical JSON
    scoring_mode: ScoringMode = "decode"
    recipe: str = "{}"  # canonical JSON

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "model_version": self.model_version,
            "tokenizer_id": self.tokenizer_id,
            "tokenizer_policy": self.tokenizer_policy,
            "token_ids": [list(r) for r in self.token_ids],
            "selected_token_ids": [list(r) for r in self.selected_token_ids],
            "active_mask": [list(r) for r in self.active_mask],
            "attention_mask": [list(r) for r in self.attention_mask],
            "position_ids": [list(r) for r in self.position_ids],
            "pre_update_state": self.pre_update_state,
            "cache_metadata": json.loads(self.cache_metadata),
            "packing_metadata": json.loads(self.packing_metadata),
            "scoring_mode": self.scoring_mode,
            "recipe": json.loads(self.recipe),
        }

    def digest(self) -> str:
        return canonical_digest(self.to_dict())

    @property
    def training_kv_cache_allowed(self) -> bool:
        """Whether the training side may attend over a KV cache (the decode scoring mode):
        only where ``cache_metadata.training_kv_cache`` says ``allowed``; teacher forcing
        without one is the default every other identity keeps."""
        metadata = json.loads(self.cache_metadata)
        return isinstance(metadata, dict) and metadata.get("training_kv_cache") == "allowed"

    @property
    def num_samples(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Scenario:
    """Metadata only: never execution mode, expectations or authorization."""

    level: str
    device: str
    fields: tuple[tuple[str, Any], ...] = ()  # other descriptive fields, sorted

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "device": self.device, **dict(self.fields)}


@dataclass(frozen=True)
class Intervention:
    path: str
    values: tuple[KnobValue, ...]


@dataclass(frozen=True)
class OperatorChoice:
    backend: str
    options: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class OperatorMapping:
    """Explicit per-side backends of ``selected_logprob``; a side left out follows logp.backend."""

    rollout: OperatorChoice | None = None
    training: OperatorChoice | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    """A strictly validated experiment, identical whether it came from Hydra or v1 JSON."""

    experiment_id: str
    scenario_id: str
    contract_source: str
    contract_version: str
    strategy: Strategy
    strict_fallback: bool
    identity: Identity
    baseline: tuple[tuple[str, KnobValue], ...]  # every allow-listed knob, sorted by path
    interventions: tuple[Intervention, ...]
    pairwise_paths: tuple[tuple[str, str], ...]
    operators: OperatorMapping | None
    scenario: Scenario

    def baseline_dict(self) -> dict[str, KnobValue]:
        return dict(self.baseline)


@dataclass(frozen=True)
class Case:
    """One planned case; ``knobs`` holds every knob's requested value (sorted by path)."""

    case_id: str
    index: int
    kind: CaseKind
    changed: tuple[tuple[str, KnobValue], ...]
    knobs: tuple[tuple[str, KnobValue], ...]

    def knob_dict(self) -> dict[str, KnobValue]:
        return dict(self.knobs)

    def label(self) -> str:
        if not self.changed:
            return "baseline"
        return ", ".join(f"{p}={v}" for p, v in self.changed)


@dataclass(frozen=True)
class ExperimentPlan:
    spec: ExperimentSpec
    cases: tuple[Case, ...]
    contract_version: str
    contract_sha256: str

    def case(self, case_id: str) -> Case:
        for case in self.cases:
            if case.case_id == case_id:
                return case
        raise KeyError(case_id)
