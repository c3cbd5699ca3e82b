"""`xconf judge` at verl scale, side by side with simply loading the dump with safetensors.

    python bench/judge.py                      # 512x2048 and 4096x4096 float32 dumps
    python bench/judge.py --shape 512x2048     # one shape
    python bench/judge.py --keep DIR           # keep the dumps and runs under DIR
    python bench/judge.py --process-only       # only the whole-process figures (below)

For each shape a verl-layout dump is written (float32 ``rollout_log_probs`` and
``old_log_probs``, an int64 ``response_mask`` with ragged lengths, int64 ``responses``),
then every phase runs in a fresh process of its own, after its imports, so the numbers are
the phase's and not the interpreter's:

* ``load``: ``safetensors.torch.load`` of the dump's bytes (the reference: every byte read,
  every tensor built; ``load_file`` alone maps the file and reads nothing);
* ``judge``: read, digest, check, judge, figures and seal the case (no report);
* ``report``: ``xconf report`` of the judged run (HTML);
* ``verify``: ``xconf verify`` of the judged run;
* the floor, what no judge can skip, done as judge does it: ``floor_read`` reads the dump
  from one descriptor and digests it (``xconf.judge.formats.read_once``: the digest of exactly
  the bytes judged), ``floor_write`` writes, fsyncs and digests the bytes of the judged
  attempt (its payloads, already in memory: ``safe_io.publish_bytes``, the sealing writer).
  ``floor_over_load_wall`` says how far above the load any judge that reads, digests and
  seals these bytes must be; the attempt's bytes per token are printed beside it.

Peak memory is the process's resident high-water mark above its resident size after the
imports (Linux: ``/proc/self/status`` VmHWM, reset through ``/proc/self/clear_refs``).
Prints one JSON object per shape with the ratios the goal is stated in: judge wall time over
load wall time (goal <= 2) and judge peak memory over the dump's tensor bytes (goal <= 3).
Timings on a shared machine are noisy: compare ratios from one run, not absolute seconds;
``cpu_s`` (every thread of the phase) is steadier there than ``wall_s``.

Then the figures as a user's machine sees them, whole processes (``/usr/bin/time -v``'s
maximum resident set size, from ``wait4``): ``xconf judge`` of a 4096x4096 dump in verl's
layout (float32 ``rollout_log_probs`` and ``old_log_probs``, a uint8 ``response_mask``: 144
MiB), beside a process that only loads that dump (its bytes read, its tensors built) and
``xconf judge`` of a 16-token dump of the same layout (the interpreter and its imports).
Each process's ``peak_rss_over_dump_bytes`` is its whole peak over the dump's bytes (the
interpreter included); ``judge_above_interpreter_over_dump_bytes`` is (judge's peak - the
16-token judge's peak) / the dump's bytes: goal <= 3.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PHASE = r"""
import json, sys, time
from pathlib import Path

phase, dump, run = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
import torch  # noqa: F401
from safetensors.torch import load
from xconf.artifacts.store import ExperimentStore
from xconf.judge.dumps import Keys, load_dump
from xconf.judge.seal import judge_cases, resolve_dtypes
from rich.console import Console


def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def prepare():
    # what a phase needs before its clock starts (the floor's payload bytes, in memory)
    if phase != "floor_write":
        return None
    (attempt,) = [a for c in (run / "judge" / "cases").iterdir() for a in c.iterdir()]
    return [(f.name, f.read_bytes()) for f in sorted(attempt.iterdir()) if f.name != "COMPLETE"]


def run_phase(payload):
    if phase == "load":
        # read every byte and build every tensor (load_file alone maps the file lazily)
        tensors = load(dump.read_bytes())
        return sum(t.numel() * t.element_size() for t in tensors.values())
    if phase == "judge":
        case = resolve_dtypes(load_dump(dump.stem, dump, Keys()), None, None, None)
        store = ExperimentStore(run, "judge")
        summary = judge_cases(store, [case], resume=False)
        return summary.records[0].result
    if phase == "report":
        from xconf.report.writer import report_after_run
        report_after_run(run / "judge", Console(file=open("/dev/null", "w")))
        return "report"
    if phase == "verify":
        from xconf.verify import verify_run
        return verify_run(run / "judge").exit_code
    if phase == "floor_read":
        from xconf.judge.formats import read_once
        return len(read_once(dump)[0])
    if phase == "floor_write":
        from xconf.artifacts.safe_io import publish_bytes
        target = run / "floor"
        target.mkdir()
        for name, data in payload:
            publish_bytes(target, name, data)
        return sum(len(data) for _, data in payload)
    raise SystemExit(phase)


if phase == "report":
    import xconf.report.writer  # noqa: F401  (its imports are not the phase's cost)
if phase == "verify":
    import xconf.verify  # noqa: F401
payload = prepare()
Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
baseline = status("VmRSS")
started, cpu = time.perf_counter(), time.process_time()
value = run_phase(payload)
wall, cpu = time.perf_counter() - started, time.process_time() - cpu
peak = status("VmHWM") - baseline
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": peak, "value": value}))
"""


def make_dump(path: Path, batch: int, length: int) -> int:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(batch, length, generator=g) * 5
    training = rollout + torch.randn(batch, length, generator=g) * 3e-6
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = torch.randint(0, 50_000, (batch, length), generator=g)
    tensors = {
        "rollout_log_probs": rollout,
        "old_log_probs": training,
        "response_mask": mask,
        "responses": ids,
    }
    save_file(tensors, str(path), metadata={"dtype": "float32"})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def phase(name: str, dump: Path, run: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PHASE, name, str(dump), str(run)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def bench(root: Path, batch: int, length: int) -> dict[str, Any]:
    dump = root / f"dump_{batch}x{length}.safetensors"
    run = root / f"run_{batch}x{length}"
    tensor_bytes = make_dump(dump, batch, length)
    phase("load", dump, run)  # warm the page cache: every phase reads a cached file
    names = ("load", "judge", "report", "verify", "floor_read", "floor_write")
    phases = {name: phase(name, dump, run) for name in names}
    load, judge = phases["load"], phases["judge"]
    floor = phases["floor_read"]["wall_s"] + phases["floor_write"]["wall_s"]
    return {
        "shape": [batch, length],
        "tokens": batch * length,
        "dump_tensor_bytes": tensor_bytes,
        "phases": phases,
        "judge_over_load_wall": judge["wall_s"] / load["wall_s"],
        "judge_peak_over_tensor_bytes": judge["peak_bytes"] / tensor_bytes,
        "attempt_bytes_per_token": phases["floor_write"]["value"] / (batch * length),
        "floor_over_load_wall": floor / load["wall_s"],
        "judge_over_floor_wall": judge["wall_s"] / floor,
        "goal": {"wall_ratio": 2.0, "memory_ratio": 3.0},
    }


LOAD_ONLY = "import sys; from safetensors.torch import load; load(open(sys.argv[1], 'rb').read())"


def verl_dump(path: Path, batch: int, length: int) -> int:
    """A dump as verl's trainer holds the three judged tensors: float32 x2, a uint8 mask."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(batch, length, generator=g) * 5
    training = rollout + torch.randn(batch, length, generator=g) * 3e-6
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).to(torch.uint8)
    tensors = {"rollout_log_probs": rollout, "old_log_probs": training, "response_mask": mask}
    save_file(tensors, str(path), metadata={"dtype": "float32"})
    return path.stat().st_size


# Started from a small interpreter of its own: a child forked from this (large) process
# would count this process's pages in its peak before it ever ran (Linux keeps the
# forking process's resident high-water mark across exec).
MEASURE = r"""
import json, os, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = proc.stderr.read()
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - started
code = os.waitstatus_to_exitcode(status)
print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_rss_bytes": usage.ru_maxrss * 1024, "exit": code,
                  "stderr": err.decode(errors="replace")[-2000:]}))
"""


def whole_process(argv: list[str]) -> dict[str, Any]:
    """A process's wall time and peak resident set size (``wait4``'s, as ``time -v`` shows)."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv], check=True, capture_output=True, text=True
    )
    figures: dict[str, Any] = json.loads(done.stdout)
    if figures.pop("exit") not in (0, 1):  # judge exits 1 when a case fails
        raise SystemExit(f"{argv} failed: {figures['stderr']}")
    del figures["stderr"]
    return figures


def process_bench(root: Path) -> dict[str, Any]:
    xconf = str(Path(sys.executable).with_name("xconf"))
    dump, tiny = root / "verl_4096x4096.safetensors", root / "verl_4x4.safetensors"
    dump_bytes = verl_dump(dump, 4096, 4096)
    verl_dump(tiny, 4, 4)
    whole_process([sys.executable, "-c", LOAD_ONLY, str(dump)])  # warm the page cache
    runs = {
        "load_only": [sys.executable, "-c", LOAD_ONLY, str(dump)],
        "judge_16_tokens": [xconf, "judge", "--case", f"tiny={tiny}", "--output-root"],
        "judge": [xconf, "judge", "--case", f"big={dump}", "--output-root"],
    }
    figures = {}
    for name, argv in runs.items():
        out = root / f"process_{name}"
        figures[name] = whole_process([*argv, str(out)] if argv[0] == xconf else argv)
    for process in figures.values():  # whole process, interpreter included
        process["peak_rss_over_dump_bytes"] = round(process["peak_rss_bytes"] / dump_bytes, 3)
    judge, interpreter = figures["judge"], figures["judge_16_tokens"]
    above = judge["peak_rss_bytes"] - interpreter["peak_rss_bytes"]
    return {
        "dump": "4096x4096 float32 x2 + uint8 mask",
        "dump_bytes": dump_bytes,
        "processes": figures,
        "judge_above_interpreter_bytes": above,
        "judge_above_interpreter_over_dump_bytes": round(above / dump_bytes, 3),
        "judge_over_load_only_wall": round(judge["wall_s"] / figures["load_only"]["wall_s"], 2),
        "goal": {"memory_ratio": 3.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=None, help="BxT, e.g. 512x2048")
    parser.add_argument("--keep", type=Path, default=None, help="keep dumps and runs here")
    parser.add_argument("--process-only", action="store_true", help="whole processes only")
    args = parser.parse_args()
    shapes = [] if args.process_only else (args.shape or ["512x2048", "4096x4096"])
    with tempfile.TemporaryDirectory(prefix="xconf-bench-judge-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for shape in shapes:
            batch, length = (int(x) for x in shape.lower().split("x"))
            print(json.dumps(bench(root, batch, length), indent=2), flush=True)
        print(json.dumps(process_bench(root), indent=2), flush=True)


if __name__ == "__main__":
    main()
