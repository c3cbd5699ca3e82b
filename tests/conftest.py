"""Shared fixtures: example documents, in-process CLI calls, directory snapshots."""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# The suite runs on small shared machines: one intra-op thread avoids oversubscription.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
S0_JSON = EXAMPLES / "cross_config_s0_cpu_smoke.json"
S3_JSON = EXAMPLES / "cross_config_s3_qwen3_8b_tp4_cp4_bf16.json"


@pytest.fixture(autouse=True)
def _file_log_handlers_restored() -> Any:
    """Each test leaves the root logger's file handlers as it found them: an in-process Hydra
    run adds its job log's FileHandler and never removes it, so without this every later test
    in the worker logs into that run's file (or, once the file's folder is gone, fails)."""
    root = logging.getLogger()
    before = set(root.handlers)
    yield
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and handler not in before:
            root.removeHandler(handler)
            handler.close()


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text("utf-8"))


@pytest.fixture(scope="session")
def _s0_cached() -> dict[str, Any]:
    return load_json(S0_JSON)


@pytest.fixture(scope="session")
def _s3_cached() -> dict[str, Any]:
    return load_json(S3_JSON)


@pytest.fixture
def s0_doc(_s0_cached: dict[str, Any]) -> dict[str, Any]:
    """A fresh, mutable copy of the S0 cpu-smoke v1 document."""
    return copy.deepcopy(_s0_cached)


@pytest.fixture
def s3_doc(_s3_cached: dict[str, Any]) -> dict[str, Any]:
    """A fresh, mutable copy of the S3 Qwen3-8B v1 document."""
    return copy.deepcopy(_s3_cached)


@pytest.fixture
def write_doc(tmp_path: Path) -> Callable[..., Path]:
    """Write a document (dict, or raw text) as a JSON file under tmp_path."""
    counter = iter(range(1_000_000))

    def write(document: dict[str, Any] | str, name: str | None = None) -> Path:
        path = tmp_path / (name or f"doc{next(counter)}.json")
        text = document if isinstance(document, str) else json.dumps(document, indent=1)
        path.write_text(text, "utf-8")
        return path

    return write


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes); empty if root is absent."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def artifact_snapshot(root: Path) -> dict[str, bytes]:
    """Like ``snapshot`` without ``report.html``: a view re-rendered after every run."""
    return {k: v for k, v in snapshot(root).items() if not k.endswith("report.html")}


@pytest.fixture
def xconf_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run the plain CLI in-process: returns (exit code, stdout, stderr)."""
    from xconf.cli.main import main

    def call(*argv: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return call


# Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), a test file is the unit
# a worker takes whole, so its module fixtures (engines, sealed runs) are built once. Every test
# of the shared local clusters goes to one worker: the fault tests kill slurmd and Ray workers,
# and a second test on the same cluster at that moment would see the fault as its own.
SERVICE_FIXTURES = frozenset({"slurm_cluster", "ray_cluster"})
# Workers take groups in collection order, so the longest go first: collected last, the
# real default's order test alone kept one worker busy for five minutes while the other idled.
LONGEST_FIRST = (
    "services",
    "tests/truth/test_order_smollm2.py",
    "tests/truth/test_fix_smollm2.py",
    "tests/adapters/test_pretrained.py",
    "tests/megatron/test_s2_runtime.py",
    "tests/reliability/test_rel_crash.py",
    "tests/truth/test_arms_smollm2.py",
    "tests/localize/test_localize_pretrained.py",
    "tests/truth/test_order_s2.py",
    "tests/launchers/test_megatron_torchrun.py",
)


def _xdist_group(item: pytest.Item) -> str:
    if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return "services"
    return item.nodeid.partition("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Workers collect (each must give the same order); the controller only schedules.
    if not (getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput")):
        return  # one process: collection order, as without xdist
    groups = {item.nodeid: _xdist_group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(groups[item.nodeid], len(rank)))  # stable
