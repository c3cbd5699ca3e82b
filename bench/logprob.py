"""Side-by-side bench: vocab-parallel selected logprob vs ``log_softmax(...).gather``.

Every variant runs in a fresh child process (TP > 1: a spawned gloo world), so peak
memory is that process's resident high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` after warm-up) minus its resident size before the timed calls.
The logits are generated tile by tile from fixed seeds, so every rank of every TP size
builds bit-identical columns; the outputs' bit digests are compared with TP=1.

    python bench/logprob.py                 # N=2048, V=151936, fp32; TP 1, 2, 4
    python bench/logprob.py --rows 64 --vocab 4096 --repeats 2   # quick smoke

Variants run the default ``impl="auto"`` (the native kernel where it builds);
``det_tp1_compiled`` is the same operator with every reduction through torch.compile.
The last lines are ``<variant> time_ratio=<x> mem_ratio=<y>``, deterministic TP=1 first.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

TILE_SEED_WIDTH = 4096  # generation chunk; independent of the operator's tiles


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> int:
    """Reset the resident high-water mark; return the current resident size in kB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS")


def _logits(rows: int, lo: int, hi: int) -> torch.Tensor:
    """Columns [lo, hi) of the fixed logits, built from per-chunk seeds."""
    out = torch.empty(rows, hi - lo)
    start = (lo // TILE_SEED_WIDTH) * TILE_SEED_WIDTH
    for chunk in range(start, hi, TILE_SEED_WIDTH):
        gen = torch.Generator().manual_seed(1000 + chunk // TILE_SEED_WIDTH)
        block = torch.randn(rows, TILE_SEED_WIDTH, generator=gen).mul_(3.0)
        a, b = max(chunk, lo), min(chunk + TILE_SEED_WIDTH, hi)
        out[:, a - lo : b - lo] = block[:, a - chunk : b - chunk]
    return out


def _targets(rows: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(7))


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.int32).numpy().tobytes())
    return h.hexdigest()[:16]


def _timed(fn: Any, repeats: int) -> tuple[float, int, Any]:
    base = _reset_peak()
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if not isinstance(result, tuple):
            result = (result,)
    return statistics.median(times), (_status_kb("VmHWM") - base) * 1024, result


def _child_single(variant: str, rows: int, vocab: int, repeats: int) -> dict[str, Any]:
    from xconf.ops.logprob.contract import LogprobContract, ReductionSpec, ShardingSpec
    from xconf.ops.logprob.impls import resolve_impl
    from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

    logits, target = _logits(rows, 0, vocab), _targets(rows, vocab)
    active = torch.ones(rows, dtype=torch.bool)
    if variant == "plain":

        def run() -> Any:
            return torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)

        torch.log_softmax(logits[:8], -1)
        seconds, peak, (out,) = _timed(run, repeats)
        read, _, _ = _timed(lambda: logits.sum(), 5)  # one read pass: the machine's pace
        return {"seconds": seconds, "peak_bytes": peak, "digest": _digest(out), "read": read}
    deterministic = variant.startswith("det_tp1")
    impl = "compiled" if variant.endswith("_compiled") else "auto"
    scope = "cross_tp_bitwise" if deterministic else "fixed_topology"
    contract = LogprobContract(
        ShardingSpec.even(vocab, vocab), reduction=ReductionSpec(determinism_scope=scope)
    )

    def call(x: torch.Tensor, t: torch.Tensor, a: torch.Tensor) -> Any:
        return vocab_parallel_selected_logprob(
            x, t, a, contract=contract, deterministic=deterministic, impl=impl
        )

    call(logits[:8], target[:8], active[:8])  # compiles the fixed-shape kernels
    seconds, peak, (logprob, lse) = _timed(lambda: call(logits, target, active), repeats)
    label = resolve_impl(impl).label  # type: ignore[arg-type]
    return {"seconds": seconds, "peak_bytes": peak, "digest": _digest(logprob, lse), "impl": label}


def _rank_main(
    rank: int, world: int, port: int, rows: int, vocab: int, repeats: int, out: str
) -> None:
    import torch.distributed as dist

    from xconf.ops.logprob.contract import LogprobContract, ShardingSpec
    from xconf.ops.logprob.impls import resolve_impl
    from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300)
    )
    contract = LogprobContract(ShardingSpec.even(vocab, vocab, world, rank))
    lo, hi = contract.sharding.local_bounds
    logits, target = _logits(rows, lo, hi), _targets(rows, vocab)
    active = torch.ones(rows, dtype=torch.bool)

    def call(x: torch.Tensor, t: torch.Tensor, a: torch.Tensor) -> Any:
        return vocab_parallel_selected_logprob(x, t, a, contract=contract)

    call(logits[:8], target[:8], active[:8])
    dist.barrier()

    def run() -> Any:
        dist.barrier()
        return call(logits, target, active)

    seconds, peak, (logprob, lse) = _timed(run, repeats)
    record = {
        "seconds": seconds,
        "peak_bytes": peak,
        "digest": _digest(logprob, lse),
        "impl": resolve_impl("auto").label,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def _child_tp(world: int, rows: int, vocab: int, repeats: int) -> dict[str, Any]:
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank_main, args=(world, port, rows, vocab, repeats, out), nprocs=world)
        records = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    digests = {r["digest"] for r in records}
    return {
        "seconds": max(r["seconds"] for r in records),
        "peak_bytes": max(r["peak_bytes"] for r in records),
        "digest": records[0]["digest"] if len(digests) == 1 else "ranks-disagree",
        "impl": records[0]["impl"],
    }


def _run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", variant, "--rows", str(args.rows)]
    cmd += ["--vocab", str(args.vocab), "--repeats", str(args.repeats)]
    if variant == "plain":
        cmd[-1] = str(args.plain_repeats)
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plain-repeats", type=int, default=3)
    parser.add_argument("--tp", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child is not None:
        if args.child.startswith("det_tp") and not args.child.startswith("det_tp1"):
            record = _child_tp(
                int(args.child.removeprefix("det_tp")), args.rows, args.vocab, args.repeats
            )
        else:
            record = _child_single(args.child, args.rows, args.vocab, args.repeats)
        print(json.dumps(record))
        return
    variants = ["plain", "det_tp1", "fast_tp1"] + [f"det_tp{w}" for w in args.tp]
    variants.append("det_tp1_compiled")
    results = {v: _run_child(v, args) for v in variants}
    plain = results["plain"]
    print(
        f"rows={args.rows} vocab={args.vocab} dtype=float32 threads={torch.get_num_threads()} "
        f"read_pass={plain['read'] * 1e3:.1f} ms"
    )
    for name, r in results.items():
        same = (
            ""
            if not name.startswith("det") or name.endswith("_compiled")
            else f" bits_equal_tp1={r['digest'] == results['det_tp1']['digest']}"
        )
        if "impl" in r:  # the build hash that ranks compare is left out here
            same += " impl=" + ":".join(r["impl"].split(":")[:2])
        print(
            f"  {name:16s} median={r['seconds'] * 1e3:9.1f} ms "
            f"extra_peak={r['peak_bytes'] / 2**20:8.1f} MiB{same}"
        )
    for name in variants[1:]:
        r = results[name]
        print(
            f"{name} time_ratio={r['seconds'] / plain['seconds']:.3f} "
            f"mem_ratio={r['peak_bytes'] / max(plain['peak_bytes'], 1):.4f}"
        )


if __name__ == "__main__":
    main()
