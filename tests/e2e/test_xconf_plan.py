"""`xconf plan`: prints the plan, writes experiment.json and plan.jsonl, builds no engine."""

from __future__ import annotations

import json

from tests.conftest import S0_JSON, S3_JSON, snapshot
from xconf.contract.loader import load_contract
from xconf.knobs import CONTRACT_KNOBS


def test_s3_plan_prints_and_writes_eleven_cases(xconf_cli, tmp_path) -> None:
    out = tmp_path / "out"
    code, stdout, _ = xconf_cli("plan", S3_JSON, "--output-root", out)
    assert code == 0
    assert "11 cases" in stdout
    experiment = out / "qwen3-8b-alignment"
    rows = [json.loads(line) for line in (experiment / "plan.jsonl").read_text().splitlines()]
    assert len(rows) == 11
    assert [r["index"] for r in rows] == list(range(11))
    assert rows[0]["kind"] == "baseline" and rows[0]["changed"] == {}
    for row in rows:
        assert row["case_id"] in stdout
        assert set(row["knobs"]) == set(CONTRACT_KNOBS)  # a v1 document: the allowlist
        assert set(row) == {"case_id", "index", "kind", "changed", "knobs", "operators"}
    assert rows[0]["knobs"]["rollout.tensor_parallel_size"] == 4
    header = json.loads((experiment / "experiment.json").read_text())
    assert header["contract"]["version"] == load_contract().version
    assert header["contract"]["sha256"] == load_contract().sha256
    assert header["scenario"]["level"] == "S3"
    assert not (experiment / "cases").exists()


def test_replanning_is_idempotent(xconf_cli, tmp_path) -> None:
    out = tmp_path / "out"
    assert xconf_cli("plan", S3_JSON, "--output-root", out)[0] == 0
    before = snapshot(out)
    assert xconf_cli("plan", S3_JSON, "--output-root", out)[0] == 0
    assert snapshot(out) == before


def test_plan_may_name_smoke_operators_without_authorization(xconf_cli, tmp_path) -> None:
    code, stdout, _ = xconf_cli("plan", S0_JSON, "--output-root", tmp_path / "out")
    assert code == 0
    assert "10 cases" in stdout and "smoke_only.logp_offset" in stdout
