"""verl 0.9.1 referees xconf's verl figures: every figure, bit for bit, on a grid of dumps.

verl is installed by ``make setup`` into ``.cache/verl-site`` (requirements/verl-referee.txt,
``--no-deps``) and runs in a child process (``verl_referee_child.py``) on the very tensors
xconf's :func:`verl_figures` sees. The grid: drifts 0 to 2, log-probabilities near 0, around
-2.5, near -30 and near -95 (where float32 ``exp`` overflows in verl, and so in xconf's
verl figures), full and ragged masks, a fully masked row, a fully masked batch, float32,
bfloat16 and float64 tensors, and verl's IS/RS settings (token and sequence TIS, IcePop,
batch normalization, several RS options). Every figure equals verl's bit for bit (NaN where
verl's is NaN); the one documented difference is verl's ZeroDivisionError when IcePop zeroes
every weight (xconf: an effective sample size of inf). xconf's exact float64 figures differ from
verl's on purpose; ``test_rollout_correction.py`` tests those differences.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from xconf.rollout_correction import PREFIX, Correction, verl_figures

ROOT = Path(__file__).resolve().parents[2]
VERL_SITE = ROOT / ".cache" / "verl-site"
CHILD = Path(__file__).with_name("verl_referee_child.py")
DRIFTS = (0.0, 1e-6, 1e-3, 0.1, 1.0, 2.0)
LEVELS = {"mid": (-5.0, 0.0), "near0": (-1e-3, 0.0), "m30": (-30.5, -29.5), "m95": (-95.5, -94.5)}
CONFIGS: tuple[dict[str, Any], ...] = (
    {},
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.5_2.0",
        "rollout_is_batch_normalize": True,
    },
    {"rollout_is": "token", "rollout_is_threshold": "0.8_1.25", "rollout_is_batch_normalize": True},
    {
        "rollout_rs": "token_k1,token_k3,seq_sum_k2,seq_mean_k1,seq_max_k3",
        "rollout_rs_threshold": "0.5_2.0,0.05,0.5,0.9_1.1,0.2",
    },
    {"rollout_is": "sequence", "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
)


def _mask(kind: str, b: int, t: int, g: torch.Generator) -> torch.Tensor:
    if kind == "full":
        return torch.ones(b, t, dtype=torch.int64)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).to(torch.int64)
    if kind == "empty_row":
        mask[1] = 0
    if kind == "empty":
        mask[:] = 0
    return mask


def grid() -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]]:
    g = torch.Generator().manual_seed(20)
    cases = {}
    b, t = 6, 40
    n = 0
    for level, (low, high) in LEVELS.items():
        for drift in DRIFTS:
            for kind in ("full", "ragged", "empty_row"):
                r = low + (high - low) * torch.rand(b, t, generator=g)
                d = drift * torch.randn(b, t, generator=g)
                tr = torch.clamp(r + d, max=0.0) if level == "near0" else r + d
                config = CONFIGS[n % len(CONFIGS)]
                n += 1
                cases[f"{level}_{drift:g}_{kind}"] = (r, tr, _mask(kind, b, t, g), config)
    r = -5.0 * torch.rand(b, t, generator=g)
    tr = r + 0.05 * torch.randn(b, t, generator=g)
    ragged = _mask("ragged", b, t, g)
    cases["empty_batch"] = (r, tr, _mask("empty", b, t, g), {})
    for i, config in enumerate(CONFIGS):
        cases[f"bf16_{i}"] = (r.bfloat16(), tr.bfloat16(), ragged, config)
        cases[f"f64_{i}"] = (r.double(), tr.double(), ragged, config)
    return cases


def _verl(tmp_path: Path, cases: dict[str, Any]) -> dict[str, dict[str, str]]:
    if not (VERL_SITE / "verl" / "__init__.py").is_file():
        pytest.fail(f"verl is not installed in {VERL_SITE}: run `make setup`")
    tensors = {}
    for name, (r, t, m, _) in cases.items():
        tensors.update({f"{name}.r": r, f"{name}.t": t, f"{name}.m": m})
    save_file({k: v.clone() for k, v in tensors.items()}, str(tmp_path / "grid.safetensors"))
    configs = [{"name": name, "config": case[3]} for name, case in cases.items()]
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    env = {**os.environ, "PYTHONPATH": str(VERL_SITE), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(tmp_path / "grid.safetensors"),
            str(tmp_path / "configs.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["verl"] == "0.9.1"
    return out["cases"]  # type: ignore[no-any-return]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a.hex() == b.hex()


@pytest.mark.slow
def test_every_figure_equals_verl_s_own_bit_for_bit(tmp_path: Path) -> None:
    cases = grid()
    verl = _verl(tmp_path, cases)
    compared = 0
    overflowed = set()
    raised = 0
    for name, (r, t, m, config) in cases.items():
        ours = verl_figures(r, t, m, correction=Correction(**config))
        if verl[name].pop("raised", None) == "ZeroDivisionError":
            # The one documented difference: every IS weight zeroed (IcePop), verl raises
            # ZeroDivisionError computing its effective sample size; xconf reports inf (null
            # in JSON). The child reran verl without IS: the other figures still compare.
            raised += 1
            assert ours[PREFIX + "rollout_is_eff_sample_size"] == math.inf, name
            weights = (PREFIX + "rollout_is_", PREFIX + "rollout_rs_")
            ours = {k: v for k, v in ours.items() if not k.startswith(weights)}
        theirs = {k: float.fromhex(v) for k, v in verl[name].items()}
        assert set(ours) == set(theirs), (name, set(ours) ^ set(theirs))
        unequal = {k: (ours[k], theirs[k]) for k in theirs if not _same(ours[k], theirs[k])}
        assert not unequal, (name, unequal)
        compared += len(theirs)
        overflowed |= {k for k, v in theirs.items() if math.isinf(v)}
    assert compared > 3000 and raised < len(cases) // 4
    # the grid reaches verl's float32 overflow, and xconf's verl figures overflow with it
    assert PREFIX + "training_ppl" in overflowed


@pytest.mark.slow
def test_judge_seals_verl_s_numbers(xconf_cli, tmp_path: Path) -> None:
    """End to end: what `xconf judge` seals is what verl logs for the dumped tensors."""
    config = {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2.0"}
    picked = ("mid_0.1_ragged", "m95_0.001_empty_row")
    # log-probabilities at most 0: judge calls anything else an invalid artifact
    cases = {
        k: (r, t.clamp(max=0.0), m, config) for k, (r, t, m, _) in grid().items() if k in picked
    }
    verl = _verl(tmp_path, cases)
    is_flags = ("--rollout-is", "sequence", "--rollout-is-threshold", "0.5_2.0")
    named = []
    for name, (r, t, m, _) in cases.items():
        dump = tmp_path / f"{name}.safetensors"
        save_file(
            {"rollout_log_probs": r, "old_log_probs": t, "response_mask": m},
            str(dump),
            metadata={"dtype": "bfloat16"},
        )
        named += ["--case", f"{name}={dump}"]
    out = tmp_path / "out"
    code, _, err = xconf_cli("judge", *named, *is_flags, "--output-root", out)
    assert code in (0, 1), err
    for name in cases:
        (attempt,) = sorted((out / "judge" / "cases" / name).iterdir())
        doc = json.loads((attempt / "comparison.json").read_text())["rollout_correction"]
        theirs = {k: float.fromhex(v) for k, v in verl[name].items()}
        seen = {PREFIX + k: v for k, v in {**doc["metrics"], **doc["weights"]}.items()}
        seen.update(doc["probability"])
        assert set(seen) == set(theirs)
        for key, value in seen.items():
            want = theirs[key]
            assert (value is None and not math.isfinite(want)) or value == want, key
        assert doc["weights"]["rollout_is_eff_sample_size"] > 0
