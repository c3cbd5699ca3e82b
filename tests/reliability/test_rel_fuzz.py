"""Campaign 4, bad input: property-based fuzzing of experiment documents and Hydra overrides.

Every input gives either a valid plan (files only under the output root) or a coded error
(exit 2, `xconf: error [code]`, nothing written at all); never a traceback, never a file
outside the output root. Ids with path separators, `..`, absolute paths, very long strings,
non-UTF-8 bytes, NaN and infinities, huge lists and unresolvable interpolations included.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.relhelpers import REPO, S0_JSON, report, scaled

SBX = "@SBX@"  # replaced by the example's sandbox: absolute paths that would escape the root
DOC_EXAMPLES = scaled(200, 200)
OVERRIDE_EXAMPLES = scaled(100, 100)
NASTY = [
    "../escape",
    "../../escape",
    "..",
    ".",
    "a/b",
    "a\\b",
    "/etc/xconf-escape",
    f"{SBX}/outside/abs",
    "x" * 5000,
    "",
    " ",
    "\x00",
    "nul\x00byte",
    "c-0000000000000000",
    "a-0001",
    "COMPLETE",
    "bf16",
    "NaN",
    "Infinity",
    "${oops}",
    "é",
    "🙂",
    "threshold",
    "-rf",
]


def bounded(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def nasty_strings() -> st.SearchStrategy[str]:
    return st.sampled_from(NASTY) | st.text(max_size=24)


def json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=True, allow_infinity=True)
        | nasty_strings()
    )
    huge = st.integers(min_value=300, max_value=20000).flatmap(
        lambda n: st.sampled_from([[1] * n, [[0] * 16] * n, ["float32"] * n])
    )
    return st.recursive(
        scalars | huge,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(nasty_strings(), inner, max_size=3)
        ),
        max_leaves=8,
    )


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):
            found += _paths(value, (*prefix, i))
    return found


S0: dict[str, Any] = json.loads(S0_JSON.read_text("utf-8"))
PATHS = sorted(_paths(S0)[1:], key=repr)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    doc = json.loads(json.dumps(S0))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
        except (KeyError, IndexError, TypeError):
            continue
        op = draw(st.sampled_from(["set", "delete", "add", "id"]))
        last = path[-1]
        with contextlib.suppress(KeyError, IndexError, TypeError):
            if op == "set":
                parent[last] = draw(json_values())
            elif op == "delete":
                del parent[last]
            elif op == "add" and isinstance(parent, dict):
                parent[draw(nasty_strings())] = draw(json_values())
            else:
                field = draw(st.sampled_from(["experiment_id", "scenario_id", "contract_version"]))
                doc[field] = draw(st.sampled_from(NASTY))
    text = json.dumps(doc, allow_nan=True)  # NaN / Infinity literals when drawn
    data = text.encode("utf-8", "surrogatepass")
    mode = draw(st.sampled_from(["plain", "plain", "plain", "bytes", "truncate", "latin1"]))
    if mode == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    elif mode == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif mode == "latin1":
        data = data.replace(b'"s0-cpu-smoke"', '"s0-cpu-smoke-\xe9\xff"'.encode("latin-1"))
    return data


TARGETED: list[bytes] = [
    json.dumps({**S0, "experiment_id": value}).encode("utf-8", "surrogatepass") for value in NASTY
] + [
    json.dumps({**S0, "baseline": {**S0["baseline"], "batch": {"size": math.nan}}}).encode(),
    json.dumps({**S0, "baseline": {**S0["baseline"], "batch": {"size": math.inf}}}).encode(),
    json.dumps(
        {**S0, "interventions": [{"path": "batch.size", "values": list(range(1, 5000))}]}
    ).encode(),
    json.dumps({**S0, "identity": {**S0["identity"], "token_ids": [[1] * 100000]}}).encode(),
    b"\xff\xfe\x00garbage",
    S0_JSON.read_bytes()[:-30],
    b"",
]


class Sandbox:
    """Per input: sandbox/in/exp.json, sandbox/root (the output root), nothing else."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0
        self.errors = 0
        self.plans = 0
        self.codes: dict[str, int] = {}

    def new(self) -> tuple[Path, Path]:
        self.count += 1
        sandbox = self.base / f"e{self.count:05d}"
        (sandbox / "in").mkdir(parents=True)
        return sandbox, sandbox / "root"

    def check(self, sandbox: Path, root: Path, code: int, err: str) -> None:
        assert "Traceback" not in err, err
        outside = [
            p
            for p in sandbox.rglob("*")
            if not (p.is_relative_to(sandbox / "in") or p.is_relative_to(root))
            and p not in (sandbox / "in", root)
        ]
        assert outside == [], outside
        if code == 0:
            self.plans += 1
            assert any(root.rglob("plan.jsonl"))
        else:
            assert code == 2, err
            assert not root.exists() or not any(root.rglob("*")), "files written on error"
            assert err.startswith("xconf: error ["), err
            error_code = err.split("[", 1)[1].split("]", 1)[0]
            self.codes[error_code] = self.codes.get(error_code, 0) + 1
            self.errors += 1


def _plain_plan(box: Sandbox, data: bytes) -> None:
    from xconf.cli.main import main

    sandbox, root = box.new()
    file = sandbox / "in" / "exp.json"
    file.write_bytes(data.replace(SBX.encode(), str(sandbox).encode()))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", str(file), "--output-root", str(root)])
    box.check(sandbox, root, code, err.getvalue())


def _repo_entries() -> list[str]:
    return sorted(n for n in os.listdir(REPO) if not n.startswith((".hypothesis", ".pytest")))


@pytest.mark.slow
def test_fuzz_experiment_documents(tmp_path: Path) -> None:
    started = time.monotonic()
    repo_before = _repo_entries()
    box = Sandbox(tmp_path)
    for data in TARGETED:
        _plain_plan(box, data)

    @bounded(DOC_EXAMPLES)
    @given(documents())
    def fuzz(data: bytes) -> None:
        _plain_plan(box, data)

    fuzz()
    assert _repo_entries() == repo_before  # nothing written into the working directory
    assert box.count >= DOC_EXAMPLES and box.errors > 0 and box.plans > 0
    seconds = time.monotonic() - started
    report(
        "fuzz_documents",
        f"{box.count} documents, {box.plans} valid plans, {box.errors} coded errors, "
        f"0 crashes, {seconds:.1f}s",
        {
            "inputs": box.count,
            "plans": box.plans,
            "coded_errors": box.errors,
            "crashes": 0,
            "codes": box.codes,
            "seconds": round(seconds, 1),
        },
    )


OVERRIDE_KEYS = [
    "experiment_id",
    "scenario_id",
    "contract_version",
    "strategy",
    "strict_fallback",
    "batch.size",
    "rollout.dtype",
    "rollout.tensor_parallel_size",
    "rollout.enable_prefix_caching",
    "training.compute_dtype",
    "training.attention_backend",
    "logp.backend",
    "identity.token_ids",
    "identity.active_mask",
    "interventions",
    "pairwise_paths",
    "scenario.level",
    "scenario.device",
    "+scenario.plan_only",
    "+threshold",
    "+rollout.atol",
    "+new_key",
    "~baseline",
    "~identity",
    "++batch.size",
    "operators",
    "case_timeout_s",
    "resume",
]
OVERRIDE_VALUES = [
    "1",
    "0",
    "-1",
    "99999999999999999999999",
    "nan",
    "inf",
    "-inf",
    "1e999",
    "null",
    "true",
    "[1,2,3]",
    "[]",
    "{a: 1}",
    "'../escape'",
    "../escape",
    "/etc/xconf-escape",
    "a/b",
    "${oops}",
    "${batch.size}",
    "a,b",
    "range(1,4)",
    "choice(a,b)",
    "'" + "x" * 3000 + "'",
    "bf16",
    "float32",
    "'\\u00e9'",
    "",
]


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    chosen = []
    for _ in range(draw(st.integers(1, 3))):
        known = st.sampled_from(OVERRIDE_KEYS)
        # unknown keys are cheap to generate but slow for Hydra to reject: one draw in five
        key = draw(st.one_of(known, known, known, known, st.from_regex(r"\A[+~]?[a-z_.]{1,12}\Z")))
        value = draw(st.sampled_from(OVERRIDE_VALUES) | st.text(max_size=12))
        chosen.append(key if key.startswith("~") else f"{key}={value}")
    return chosen


@pytest.mark.slow
def test_fuzz_hydra_overrides(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from xconf.cli.hydra_app import run_from_config
    from xconf.runtime.loading import conf_dir

    started = time.monotonic()
    box = Sandbox(tmp_path)
    rejected_by_hydra = 0

    def attempt(fuzzed: list[str]) -> None:
        nonlocal rejected_by_hydra
        sandbox, root = box.new()
        fuzzed = [o.replace(SBX, str(sandbox)) for o in fuzzed]
        full = ["+experiment=cpu_smoke", "mode=plan", *fuzzed, f"output_root={root}"]
        try:
            cfg = compose("config", overrides=full)
        except (HydraException, OmegaConfBaseException, ValueError):
            # Hydra's own grammar or composition error: the CLI prints it and exits 2
            rejected_by_hydra += 1
            assert not root.exists()
            return
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = run_from_config(cfg, full, None)
        box.check(sandbox, root, code, err.getvalue())

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for value in [*NASTY[:9], "${oops}"]:
            attempt([f"experiment_id='{value}'"])
        attempt([f"output_root={SBX}/elsewhere", "experiment_id=../../up"])

        @bounded(OVERRIDE_EXAMPLES)
        @given(overrides())
        def fuzz(fuzzed: list[str]) -> None:
            attempt(fuzzed)

        fuzz()
    assert box.count >= OVERRIDE_EXAMPLES
    seconds = time.monotonic() - started
    report(
        "fuzz_overrides",
        f"{box.count} override sets, {box.plans} valid plans, {box.errors} coded errors, "
        f"{rejected_by_hydra} rejected by Hydra's grammar, 0 crashes, {seconds:.1f}s",
        {
            "inputs": box.count,
            "plans": box.plans,
            "coded_errors": box.errors,
            "hydra_rejected": rejected_by_hydra,
            "crashes": 0,
            "codes": box.codes,
            "seconds": round(seconds, 1),
        },
    )
