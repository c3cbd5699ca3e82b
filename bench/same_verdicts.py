"""Whether a run's verdicts equal a reference run's, every figure of every case, bit for bit.

    python bench/same_verdicts.py REFERENCE_EXPERIMENT_DIR NEW_EXPERIMENT_DIR

Each directory is an experiment's output (``.../pretrained/s2-smollm2``, holding ``cases/``),
e.g. the reference of issue #33 (``/work/tools/bench_idle_run/pretrained/s2-smollm2``, main
9d6ed08, idle) and a ``bench/runtime.py`` run of today's code. For every case of the
reference (matched by case id, the latest attempt of each), ``comparison.json`` must be
equal as parsed JSON (floats compared by their exact value: the verdict, counts, every
diff quantile, the full-vocabulary figures, the rollout-correction figures) and each
scored-token tensor file (``score_rollout``, ``score_training``, ``token_diffs``) equal
tensor by tensor, bitwise. Prints one line per case and exits 1 on any difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TENSORS = ("score_rollout.safetensors", "score_training.safetensors", "token_diffs.safetensors")


def _latest(case: Path) -> Path | None:
    attempts = sorted(p for p in case.glob("a-*") if (p / "COMPLETE").exists())
    return attempts[-1] if attempts else None


def _diff(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _diff(x, y, f"{where}[{i}]")
        ]
    same = a == b and type(a) is type(b)
    return [] if same else [f"{where}: {a!r} vs {b!r}"]


def _tensors_equal(a: Path, b: Path) -> list[str]:
    import torch
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    if set(x) != set(y):
        return [f"{a.name}: tensors {sorted(x)} vs {sorted(y)}"]
    out = []
    for name in sorted(x):
        u, v = x[name], y[name]
        if u.dtype != v.dtype or u.shape != v.shape:
            out.append(f"{a.name}:{name}: {u.dtype}{tuple(u.shape)} vs {v.dtype}{tuple(v.shape)}")
        elif not torch.equal(_bits(u), _bits(v)):
            out.append(f"{a.name}:{name}: bits differ")
    return out


def _bits(t: Any) -> Any:
    """The tensor's bytes (NaN == NaN, -0.0 != 0.0): floats compared as their bits."""
    return t.reshape(-1).view(torch_uint8()) if t.is_floating_point() else t


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def main(reference: Path, new: Path) -> int:
    bad = 0
    cases = sorted((reference / "cases").iterdir())
    for case in cases:
        ref = _latest(case)
        got = _latest(new / "cases" / case.name)
        if ref is None:
            continue
        if got is None:
            print(f"{case.name}: missing in {new}")
            bad += 1
            continue
        document = json.loads((ref / "comparison.json").read_text())
        problems = _diff(document, json.loads((got / "comparison.json").read_text()))
        for name in TENSORS:
            if (ref / name).exists() or (got / name).exists():
                if not ((ref / name).exists() and (got / name).exists()):
                    problems.append(f"{name}: only in one")
                else:
                    problems += _tensors_equal(ref / name, got / name)
        changed = ",".join(
            f"{k}={v}" for k, v in document.get("intervention", {}).items() if k == "x"
        )
        label = f"{case.name} {document.get('result')} {document.get('mismatches')}{changed}"
        print(f"{label}: {'bitwise equal' if not problems else 'DIFFERS'}")
        for p in problems[:10]:
            print(f"    {p}")
        bad += bool(problems)
    print(f"{len(cases) - bad} of {len(cases)} cases bitwise equal")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
