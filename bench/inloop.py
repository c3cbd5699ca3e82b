"""Side-by-side bench: ``xconf.judge_batch`` on one training step's tensors.

In one process, repeat by repeat and interleaved, four things on the same tensors: a read
pass (``rollout.sum() + training.sum()``: the machine's floor), the bare pass/fail rule
(``(abs(t - r) > threshold) & mask``, counted: what any in-loop check costs at least),
verl's figures alone (``xconf.rollout_correction.rollout_correction``: verl's and the exact
float64 ones, the part of ``judge_batch`` that is the figures' owner's) and ``judge_batch``
(the rule, every diagnostic and verl's figures). Each time is the median;
the ratios hold on a busy machine. The default is 1M tokens: B=512 responses of T=2048, a
ragged mask (each row's length drawn from a fixed seed), float32.

    python bench/inloop.py                          # CPU, 512 x 2048
    python bench/inloop.py --rows 64 --cols 256     # quick smoke
    python bench/inloop.py --device cuda            # a GPU tensor (copied to the CPU once)

The last lines are ``judge_batch seconds=<median> read_ratio=<t/read pass>
rule_ratio=<t/bare rule> figures_share=<verl's figures / t> tokens=<active>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def _tensors(rows: int, cols: int, device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(20260101)
    rollout = -torch.rand((rows, cols), generator=g) * 6 - 1e-3
    # log-probabilities: at most 0 (judge refuses p > 1 as invalid_artifact)
    training = (rollout + torch.randn((rows, cols), generator=g) * 2e-3).clamp(max=0.0)
    lengths = torch.randint(cols // 4, cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols)[None, :] < lengths[:, None]).to(torch.int64)
    return tuple(t.to(device) for t in (rollout, training, mask))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn: Callable[[], Any], device: str) -> float:
    _sync(device)
    started = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import xconf
    from xconf.contract.loader import load_contract
    from xconf.rollout_correction import rollout_correction

    rollout, training, mask = _tensors(args.rows, args.cols, args.device)
    threshold = load_contract().threshold_for("float32", "float32").value
    active = mask.bool()

    def read() -> Any:
        return float(rollout.sum() + training.sum())

    def rule() -> Any:
        return int(((training - rollout).abs() > threshold).logical_and(active).sum())

    def figures() -> Any:
        return rollout_correction(rollout, training, active)

    def judge() -> Any:
        return xconf.judge_batch(
            rollout, training, mask, rollout_dtype="float32", training_dtype="float32"
        )

    verdict = judge()  # warm-up: imports, the contract, first allocations
    times: dict[str, list[float]] = {"read": [], "rule": [], "figures": [], "judge_batch": []}
    runs = (("read", read), ("rule", rule), ("figures", figures), ("judge_batch", judge))
    for _ in range(args.repeats):
        for name, fn in runs:
            times[name].append(_time(fn, args.device))
    median = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"device={args.device} rows={args.rows} cols={args.cols} threads="
        f"{torch.get_num_threads()} repeats={args.repeats} result={verdict.result}"
    )
    for name in ("read", "rule", "figures"):
        print(f"{name} seconds={median[name]:.6f}")
    print(
        f"judge_batch seconds={median['judge_batch']:.6f} "
        f"read_ratio={median['judge_batch'] / median['read']:.1f} "
        f"rule_ratio={median['judge_batch'] / median['rule']:.1f} "
        f"figures_share={median['figures'] / median['judge_batch']:.2f} "
        f"tokens={int(verdict.figures['xconf/active_tokens'])}"
    )


if __name__ == "__main__":
    main()
