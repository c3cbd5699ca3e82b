"""Shared helpers of the reliability campaigns: experiments, snapshots, final state, reports."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
S0_JSON = REPO / "examples" / "cross_config_s0_cpu_smoke.json"
SCALE = float(os.environ.get("XCONF_RELIABILITY_SCALE", "1"))
# The S0 interventions the campaigns keep by default (a pass, a chunking change, a mixed-dtype
# fail and the smoke offset fail); XCONF_RELIABILITY_FULL_S0=1 runs all ten S0 cases.
MINI_PATHS = ("batch.size", "rollout.dtype", "logp.backend")
MINI_VALUES: dict[str, list[Any]] = {
    "batch.size": [1],
    "rollout.dtype": ["bfloat16"],
    "logp.backend": ["smoke_only.logp_offset"],
}
RUN_FLAGS = ("--runtime", "cpu-smoke", "--allow-smoke-operators")


def scaled(default: int, minimum: int) -> int:
    """A campaign count: ``default`` times XCONF_RELIABILITY_SCALE, never below ``minimum``."""
    return max(minimum, int(default * SCALE))


def s0_document(experiment_id: str = "rel-s0") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(S0_JSON.read_text("utf-8"))
    doc["experiment_id"] = experiment_id
    if os.environ.get("XCONF_RELIABILITY_FULL_S0") != "1":
        doc["interventions"] = [{"path": path, "values": MINI_VALUES[path]} for path in MINI_PATHS]
    return doc


def write_experiment(directory: Path, experiment_id: str = "rel-s0") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{experiment_id}.json"
    path.write_text(json.dumps(s0_document(experiment_id), indent=1), "utf-8")
    return path


def child_env() -> dict[str, str]:
    """Children import this tree first, use one intra-op thread and no user site."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def cli(*argv: str | Path) -> int:
    """The plain CLI in-process, output swallowed; returns the exit code."""
    from xconf.cli.main import main

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            return main([str(a) for a in argv])
        except SystemExit as exc:
            return int(exc.code or 0)


def cli_output(*argv: str | Path) -> tuple[int, str]:
    """The plain CLI in-process: exit code and everything it printed (stdout and stderr)."""
    from xconf.cli.main import main

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, sink.getvalue()


Entry = tuple[str, int, int, bytes]  # kind, inode, mtime_ns, bytes (or link target)


def snapshot(root: Path) -> dict[str, Entry]:
    """Every entry under ``root`` (no link followed): kind, inode, mtime and content."""
    found: dict[str, Entry] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                entry: Entry = ("link", st.st_ino, st.st_mtime_ns, os.readlink(path).encode())
            elif stat.S_ISDIR(st.st_mode):
                entry = ("dir", st.st_ino, 0, b"")
            else:
                entry = ("file", st.st_ino, st.st_mtime_ns, path.read_bytes())
            found[str(path.relative_to(root))] = entry
    return found


# Derived views re-rendered after every run; not part of the append-only artifact set.
VIEW_FILES = ("report.html",)


def unchanged(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """Paths of ``before`` that were modified or removed; plan.jsonl may only grow."""
    changed = []
    for rel, (kind, ino, mtime, data) in before.items():
        if rel.endswith(VIEW_FILES):
            continue
        now = after.get(rel)
        if now is None:
            changed.append(f"{rel}: removed")
        elif rel.endswith("plan.jsonl") and kind == "file":
            if now[1] != ino or not now[3].startswith(data):
                changed.append(f"{rel}: rewritten (not an append)")
        elif kind == "dir":
            if now[0] != "dir" or now[1] != ino:
                changed.append(f"{rel}: replaced")
        elif now != (kind, ino, mtime, data):
            changed.append(f"{rel}: modified")
    return changed


def tensor_bytes(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Each tensor of a safetensors file as (dtype, shape, raw bytes): a bitwise fingerprint."""
    import torch

    from xconf.artifacts.store import read_tensors

    return {
        k: (
            str(v.dtype),
            tuple(v.shape),
            v.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(),
        )
        for k, v in sorted(read_tensors(path).items())
    }


TENSOR_FILES = (
    "score_rollout.safetensors",
    "score_training.safetensors",
    "token_diffs.safetensors",
)


def attempt_state(attempt: Path) -> dict[str, Any]:
    """What must be bit-identical between two runs of one case: verdict and tensors."""
    return {
        "comparison": json.loads((attempt / "comparison.json").read_text("utf-8")),
        **{name: tensor_bytes(attempt / name) for name in TENSOR_FILES},
    }


def valid_attempts(experiment_dir: Path) -> dict[str, list[Path]]:
    """Per case, its valid sealed attempts (newest first)."""
    from xconf.artifacts.store import ExperimentStore

    store = ExperimentStore(experiment_dir.parent, experiment_dir.name)
    return {
        case: [p for p in store.attempts(case) if store.verify_attempt(p).valid]
        for case in store.case_ids()
    }


def final_state(experiment_dir: Path) -> dict[str, dict[str, Any]]:
    """Per case, the state of its newest valid attempt (what resume would reuse)."""
    return {case: attempt_state(paths[0]) for case, paths in valid_attempts(experiment_dir).items()}


def report(campaign: str, line: str, numbers: dict[str, Any]) -> None:
    """One summary line per campaign on stdout and in a JSON file (XCONF_RELIABILITY_REPORT)."""
    target = Path(
        os.environ.get(
            "XCONF_RELIABILITY_REPORT",
            str(Path(tempfile.gettempdir()) / "xconf-reliability.json"),
        )
    )
    try:
        existing = json.loads(target.read_text("utf-8")) if target.exists() else {}
    except ValueError:
        existing = {}
    existing[campaign] = numbers
    target.write_text(json.dumps(existing, indent=1, sort_keys=True), "utf-8")
    print(f"\n[reliability] {campaign}: {line}", flush=True)


class ForkServer:
    """tests/reliability/crash_child.py: imports xconf once, forks a child per request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("crash_child.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_env(),
            cwd=REPO,
            text=True,
        )

    def send(self, **request: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    @property
    def replies(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def receive(self) -> dict[str, Any]:
        line = self.replies.readline()
        assert line, "the fork server died"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, **request: Any) -> dict[str, Any]:
        self.send(**request)
        return self.receive()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
