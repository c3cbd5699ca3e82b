"""The full-vocabulary figures' own cost, and that they equal an earlier revision's bit for bit.

    python bench/full_vocab_figures.py [--rev 9d6ed08] [--rows 2304] [--vocab 49152]

Loads ``xconf/full_vocab.py`` as it was at ``--rev`` (git) beside today's, computes both on
the same rows (the real default's shape: 2,304 positions x 49,152 tokens; float32 logits of
a peaked distribution, a float32 copy moved by ~1e-5 as the float32 cases differ, and a
bfloat16-rounded copy, whose exact ties take the tie rule), at torch's intra-op thread
count of an in-process vLLM engine (1), and prints each one's wall time per pair of sides
and whether every per-position figure is bitwise equal. Timings taken while others use the
machine are "busy".
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]


def _module_at(rev: str) -> ModuleType:
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:xconf/full_vocab.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"full_vocab_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"full_vocab_{rev}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="9d6ed08")
    parser.add_argument("--rows", type=int, default=2304)
    parser.add_argument("--vocab", type=int, default=49152)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import xconf.full_vocab as today

    before = _module_at(args.rev)
    g = torch.Generator().manual_seed(0)
    rollout = torch.randn(args.rows, args.vocab, generator=g) * 4.0
    pairs = {
        "float32": rollout + torch.randn(args.rows, args.vocab, generator=g) * 1e-5,
        "bfloat16": rollout.to(torch.bfloat16).to(torch.float32),
    }
    same = True
    for label, training in pairs.items():
        walls, figures = {}, {}
        for name, module in (("before", before), ("today", today)):
            start = time.perf_counter()
            figures[name] = module.position_figures(rollout, training)
            walls[name] = time.perf_counter() - start
        equal = all(
            torch.equal(figures["before"][k], figures["today"][k]) for k in figures["before"]
        )
        same &= equal
        print(
            f"{label:9} {args.rev}: {walls['before']:7.2f} s  today: {walls['today']:7.2f} s  "
            f"ratio {walls['today'] / walls['before']:.3f}  bitwise equal: {equal}"
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
