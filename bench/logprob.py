"""Side-by-side bench: vocab-parallel selected logprob vs ``log_softmax(...).gather``.

Ratios are measured side by side, so they hold on a busy machine: in one process the
plain way, one read pass over the logits (``logits.sum()``: the machine's own floor) and
the operator run interleaved, repeat by repeat, and each time is the median; TP > 1 runs
as a spawned gloo world (CPU) whose ranks run the operator after a barrier each repeat,
interleaved with a read pass of each rank's own shard (all ranks at once: the world's own
floor, measured side by side with it, printed as ``world_read_passes``).
Peak memory: on CPU the resident high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) over one call, minus the resident size before it; on CUDA
``max_memory_allocated`` over one call, minus the allocated size before it.

    python bench/logprob.py                  # CPU: N=2048, V=151936, fp32; TP 1, 2, 4
    python bench/logprob.py --rows 64 --vocab 4096 --repeats 2      # quick smoke
    python bench/logprob.py --device cuda --dtype bfloat16 --rows 4096   # on a GPU

On CPU the logits are generated tile by tile from fixed seeds, so every rank of every TP
size builds bit-identical columns, and the outputs' bit digests are compared with TP=1; on
CUDA the TP 1/2/4/8 bits are compared by simulating the shards in one process
(``xconf.ops.logprob.simulate``). Variants run ``impl="auto"`` (native kernel on CPU,
Triton on CUDA). The last lines are ``<variant> time_ratio=<t/plain> floor_ratio=<t/read
pass> mem_ratio=<peak/plain peak>``, then a note on the removed fast path.
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
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def _peak_of(fn: Any, device: str) -> int:
    """Extra peak bytes of one call of ``fn``."""
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    base = _reset_peak()
    fn()
    return (_status_kb("VmHWM") - base) * 1024


def _interleaved(
    fns: dict[str, Any], repeats: int, device: str, sync: Any = None
) -> dict[str, float]:
    """Median seconds of each function, run round-robin so load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for repeat in range(repeats):
        # Every other repeat in reverse order, so no variant always runs after another.
        order = list(fns.items()) if repeat % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            if sync is not None:
                sync()
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


# Printed with every run, so a reader of the figures sees why there is one production path.
FAST_PATH_REMOVED = (
    "fast path (deterministic=False, xconf.vocab_parallel_logp_fast) removed: not faster than "
    "the deterministic path at every TP degree (idle 2-core machine, N=2048 V=151936 fp32, "
    "read pass 60.2 ms: det/fast 1.25/1.23 read passes at TP1, 1.37/1.37 at TP2, "
    "1.60/1.52 at TP4; fast_vs_det 0.987, 1.002, 0.948)"
)


def _contract(vocab: int, dtype: torch.dtype, world: int = 1, rank: int = 0) -> Any:
    from xconf.ops.logprob.contract import LogprobContract, ShardingSpec, dtype_name

    return LogprobContract(
        ShardingSpec.even(vocab, vocab, world, rank),
        logits_dtype=dtype_name(dtype),  # type: ignore[arg-type]
    )


def _child_single(args: argparse.Namespace) -> dict[str, Any]:
    from xconf.ops.logprob.impls import resolve_impl
    from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

    torch.set_num_threads(args.threads)
    device, dtype = args.device, DTYPES[args.dtype]
    rows, vocab = args.rows, args.vocab
    if device == "cuda":
        gen = torch.Generator(device="cuda").manual_seed(1000)
        logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3.0).to(dtype)
    else:
        logits = _logits(rows, 0, vocab).to(dtype)
    target = _targets(rows, vocab).to(device)
    active = torch.ones(rows, dtype=torch.bool, device=device)
    det_c = _contract(vocab, dtype)

    def det() -> Any:
        return vocab_parallel_selected_logprob(logits, target, active, contract=det_c)

    def plain() -> Any:
        return torch.log_softmax(logits.float(), -1).gather(-1, target[:, None]).squeeze(-1)

    def read() -> Any:
        return logits.sum()

    fns = {"plain": plain, "read": read, "det": det}
    for fn in fns.values():  # warm-up: builds and compiles the kernels
        fn()
    peaks = {name: _peak_of(fn, device) for name, fn in fns.items() if name != "read"}
    times = _interleaved(fns, args.repeats, device)
    record: dict[str, Any] = {
        "times": times,
        "peaks": peaks,
        "det_digest": _digest(*det()),
        "impl": resolve_impl("auto", device).label,
    }
    if device == "cuda":
        from xconf.ops.logprob.simulate import simulated_forward

        digests = {
            world: _digest(
                *simulated_forward(logits, target, active, real_vocab_size=vocab, world=world)
            )
            for world in (1, 2, 4, 8)
        }
        record["simulated_tp_bits_equal"] = len(set(digests.values())) == 1
        record["simulated_equals_operator"] = digests[1] == record["det_digest"]
    return record


def _rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

    torch.set_num_threads(max(1, args.threads // world))  # the same cores in all
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300)
    )
    dtype = DTYPES[args.dtype]
    det_c = _contract(args.vocab, dtype, world, rank)
    lo, hi = det_c.sharding.local_bounds
    logits, target = _logits(args.rows, lo, hi).to(dtype), _targets(args.rows, args.vocab)
    active = torch.ones(args.rows, dtype=torch.bool)

    def det() -> Any:
        return vocab_parallel_selected_logprob(logits, target, active, contract=det_c)

    def read() -> Any:
        return logits.sum()

    det()
    peaks = {"det": _peak_of(det, "cpu")}
    times = _interleaved({"read": read, "det": det}, args.repeats, "cpu", sync=dist.barrier)
    record = {"times": times, "peaks": peaks, "det_digest": _digest(*det())}
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def _child_tp(world: int, args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank_main, args=(world, port, args, out), nprocs=world)
        records = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    digests = {r["det_digest"] for r in records}
    return {
        "times": {k: max(r["times"][k] for r in records) for k in ("read", "det")},
        "peaks": {"det": sum(r["peaks"]["det"] for r in records)},
        "det_digest": records[0]["det_digest"] if len(digests) == 1 else "ranks-disagree",
    }


def _run_child(args: argparse.Namespace, world: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(world), "--rows", str(args.rows)]
    cmd += ["--vocab", str(args.vocab), "--repeats", str(args.repeats)]
    cmd += ["--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--tp", type=int, nargs="*", default=None, help="CPU only; default 2 4")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", type=int, default=None)
    args = parser.parse_args()
    if args.child is not None:
        record = _child_single(args) if args.child == 1 else _child_tp(args.child, args)
        print(json.dumps(record))
        return
    tps = ([] if args.device == "cuda" else [2, 4]) if args.tp is None else args.tp
    if args.device == "cuda" and tps:
        parser.error("--tp needs CPU gloo worlds; on CUDA the TP bits are simulated")
    single = _run_child(args, 1)
    worlds = {w: _run_child(args, w) for w in tps}
    plain_t, read_t = single["times"]["plain"], single["times"]["read"]
    plain_peak = max(single["peaks"]["plain"], 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"rows={args.rows} vocab={args.vocab} dtype={args.dtype} device={args.device} "
        f"threads={args.threads} load_avg={load:.2f} impl={single['impl']}"
    )
    print(f"  read_pass median={read_t * 1e3:9.2f} ms (one pass over the logits: the floor)")
    print(f"  plain     median={plain_t * 1e3:9.2f} ms extra_peak={plain_peak / 2**20:9.1f} MiB")
    rows: list[tuple[str, float, int, str]] = []
    for world, record in [(1, single), *worlds.items()]:
        same = record["det_digest"] == single["det_digest"]
        note = ""
        if world > 1:
            world_read = record["times"]["read"]
            note = (
                f" bits_equal_tp1={same} world_read_pass={world_read * 1e3:.2f} ms"
                f" world_read_passes={record['times']['det'] / world_read:.2f}"
            )
        rows.append((f"det_tp{world}", record["times"]["det"], record["peaks"]["det"], note))
    if "simulated_tp_bits_equal" in single:
        rows[0] = (
            *rows[0][:3],
            f" simulated_tp1_2_4_8_bits_equal={single['simulated_tp_bits_equal']}"
            f" simulated_equals_operator={single['simulated_equals_operator']}",
        )
    for name, seconds, peak, note in rows:
        print(
            f"  {name:9s} median={seconds * 1e3:9.2f} ms extra_peak={peak / 2**20:9.1f} MiB "
            f"read_passes={seconds / read_t:.2f}{note}"
        )
    for name, seconds, peak, _ in rows:
        print(
            f"{name} time_ratio={seconds / plain_t:.3f} floor_ratio={seconds / read_t:.3f} "
            f"mem_ratio={peak / plain_peak:.4f}"
        )
    print(FAST_PATH_REMOVED)


if __name__ == "__main__":
    main()
