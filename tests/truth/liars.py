"""Misbehaving runtimes built on the real cpu-smoke adapter, each wrong on exactly one case.

Each runtime misbehaves only in the case where ``trigger`` (a knob path) takes ``value``, and in
exactly one way; every other case is scored by the unmodified cpu-smoke engines.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.adapters.errors import IdentityViolationError


class _Wrapped:
    """An engine whose ``score`` (and optionally ``readback``) is bent by its runtime."""

    def __init__(self, engine: Any, runtime: Liar) -> None:
        self._engine = engine
        self._runtime = runtime

    def score(self, inputs: Any, identity: Any, batch_size: int, op: Any) -> Any:
        return self._runtime.bent_score(self._engine, inputs, identity, batch_size, op)

    def readback(self) -> Any:
        return self._runtime.bent_readback(self._engine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class Liar(CpuSmokeRuntime):
    """cpu-smoke, bent on ``side`` in the one case where ``trigger`` equals ``value``."""

    def __init__(self, trigger: str, value: Any, side: str = "rollout", **options: Any) -> None:
        super().__init__(**options)
        self.trigger, self.value, self.side = trigger, value, side

    def hit(self, case: Any) -> bool:
        return case.case.knob_dict().get(self.trigger) == self.value and any(
            path == self.trigger for path, _ in case.case.changed
        )

    def build_engine(self, binding: Any, case: Any) -> Any:
        if binding.side == self.side and self.hit(case):
            return _Wrapped(self.bent_build(binding, case), self)
        return super().build_engine(binding, case)

    def bent_build(self, binding: Any, case: Any) -> Any:
        return super().build_engine(binding, case)

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        return engine.score(inputs, identity, batch, op)

    def bent_readback(self, engine: Any) -> Any:
        return engine.readback()


class IgnoresEager(Liar):
    """Builds the eager engine although enforce_eager=False was set, and says so on readback."""

    def __init__(self, **options: Any) -> None:
        super().__init__("rollout.enforce_eager", False, **options)

    def bent_build(self, binding: Any, case: Any) -> Any:
        knobs = tuple(
            replace(k, materialized=True) if k.path == "rollout.enforce_eager" else k
            for k in binding.knobs
        )
        return CpuSmokeRuntime.build_engine(self, replace(binding, knobs=knobs), case)


class MutatesInputs(Liar):
    """Writes a different token into the frozen token ids in place, then scores them."""

    def __init__(self, **options: Any) -> None:
        super().__init__("training.attention_backend", "eager", side="training", **options)

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        inputs.token_ids[0, 1] = (inputs.token_ids[0, 1] + 1) % self.model_config.vocab_size
        return engine.score(inputs, identity, batch, op)


class ExtremeScore(Liar):
    """Returns a finite extreme score (``extreme``) on one active rollout token."""

    def __init__(self, extreme: float = -1e4, **options: Any) -> None:
        super().__init__("rollout.enable_prefix_caching", True, **options)
        self.extreme = extreme

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        score = engine.score(inputs, identity, batch, op)
        b, t = (int(i) for i in torch.nonzero(inputs.active_mask)[0])
        logprobs = score.logprobs.clone()
        logprobs[b, t] = self.extreme
        return replace(score, logprobs=logprobs)


class DivergedDecoding(Liar):
    """The rollout engine reports that forced decoding left the frozen tokens."""

    def __init__(self, **options: Any) -> None:
        super().__init__("rollout.dtype", "bfloat16", **options)

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        raise IdentityViolationError(
            "identity.forced_decoding_diverged",
            "sample 0 position 3: the engine emitted token 5, the frozen token is 7",
            "rollout",
        )


class ReadbackRaises(Liar):
    """Scores honestly, but reading the training engine's live state back raises."""

    def __init__(self, **options: Any) -> None:
        super().__init__("training.attention_backend", "eager", side="training", **options)

    def bent_readback(self, engine: Any) -> Any:
        raise RuntimeError("the engine's state went away while reading it back")


class SameAsCpuSmoke(CpuSmokeRuntime):
    """Behaves exactly like cpu-smoke under another ``_target_``."""


class TrainsInBfloat16(Liar):
    """Builds the training engine in bfloat16 although float32 was set (not the intervention:
    the case changes the attention backend), and reads back what it built."""

    def __init__(self, **options: Any) -> None:
        super().__init__("training.attention_backend", "eager", side="training", **options)

    def bent_build(self, binding: Any, case: Any) -> Any:
        knobs = tuple(
            replace(k, materialized="bfloat16") if k.path == "training.compute_dtype" else k
            for k in binding.knobs
        )
        return CpuSmokeRuntime.build_engine(self, replace(binding, knobs=knobs), case)


class OwnsOptimizer(Liar):
    """Creates an optimizer over the training model's parameters while scoring (never steps)."""

    def __init__(self, **options: Any) -> None:
        super().__init__("training.attention_backend", "eager", side="training", **options)

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        self.optimizer = torch.optim.SGD(engine.model.parameters(), lr=0.0)
        return engine.score(inputs, identity, batch, op)


class ScoresOtherTokens(Liar):
    """Scores a copy with one token changed, then echoes the frozen ids as what it scored."""

    def __init__(self, **options: Any) -> None:
        super().__init__("training.attention_backend", "eager", side="training", **options)

    def bent_score(self, engine: Any, inputs: Any, identity: Any, batch: int, op: Any) -> Any:
        other = replace(inputs, token_ids=inputs.token_ids.clone())
        other.token_ids[0, 2] = (other.token_ids[0, 2] + 1) % self.model_config.vocab_size
        score = engine.score(other, identity, batch, op)
        return replace(score, scored_token_ids=inputs.token_ids.clone())
