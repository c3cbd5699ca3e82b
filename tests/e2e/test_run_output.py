"""Third-party output goes to the run's log file; the terminal keeps xconf's own output."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

# A child that writes the way vLLM, transformers and torch do while a run's progress bar is
# up: a root handler made before the run (Hydra's), a library handler made during it
# (transformers' own stderr handler), Python warnings, tqdm, print, native printf (C stdio
# buffer) and raw descriptor writes. xconf's own console line must stay on the terminal.
CHILD = textwrap.dedent(
    """
    import ctypes, logging, os, sys, warnings
    from pathlib import Path

    from xconf.cli.render import case_progress, make_console
    from xconf.run_output import OutputPolicy, third_party_output

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    run_dir, verbose = Path(sys.argv[1]), sys.argv[2] == "verbose"
    console = make_console()
    with case_progress(console, 1):
        with third_party_output(run_dir, OutputPolicy(verbose, console)):
            from transformers.utils import logging as hf_logging
            from tqdm import tqdm

            hf_logging.get_logger("transformers.modeling_utils").warning("TP-HF-LOG")
            logging.getLogger("torch.distributed").warning("TP-ROOT-LOG")
            warnings.warn("TP-PY-WARNING")
            for _ in tqdm(range(3), desc="TP-TQDM"):
                pass
            print("TP-PRINT-STDOUT")
            print("TP-PRINT-STDERR", file=sys.stderr)
            ctypes.CDLL(None).printf(b"TP-C-PRINTF\\n")
            os.write(1, b"TP-FD1\\n")
            os.write(2, b"TP-FD2\\n")
            console.print("XCONF-OWN-LINE")
    print("XCONF-AFTER")
    hf_logging.get_logger("transformers.x").warning("TP-AFTER-HF")
    """
)
MARKERS = (
    "TP-HF-LOG",
    "TP-ROOT-LOG",
    "TP-PY-WARNING",
    "TP-TQDM",
    "TP-PRINT-STDOUT",
    "TP-PRINT-STDERR",
    "TP-C-PRINTF",
    "TP-FD1",
    "TP-FD2",
)


def _child(run_dir: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


@pytest.mark.slow
def test_third_party_output_lands_in_the_run_log_not_on_the_terminal(tmp_path) -> None:
    quiet = _child(tmp_path, "quiet")
    terminal = quiet.stdout + quiet.stderr
    log = (tmp_path / "xconf.log").read_text()
    assert "XCONF-OWN-LINE" in quiet.stdout and "XCONF-AFTER" in quiet.stdout
    assert "XCONF-OWN-LINE" not in log
    for marker in MARKERS:
        assert marker in log, marker
        assert marker not in terminal, marker
    # A handler a library made during the run keeps working afterwards, on the terminal.
    assert "TP-AFTER-HF" in quiet.stderr
    assert log.startswith("== xconf: third-party output")

    verbose_dir = tmp_path / "verbose"
    verbose_dir.mkdir()
    loud = _child(verbose_dir, "verbose")
    assert not (verbose_dir / "xconf.log").exists()
    for marker in (*MARKERS, "XCONF-OWN-LINE"):
        assert marker in loud.stdout + loud.stderr, marker


def test_verbose_is_a_run_option_on_both_front_ends(xconf_cli, tmp_path, monkeypatch) -> None:
    from tests.conftest import S0_JSON

    out = tmp_path / "out"
    code, stdout, _ = xconf_cli(
        "run",
        S0_JSON,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--verbose",
        "--output-root",
        out,
    )
    assert code == 1 and "(new)" in stdout  # the offset case fails by design
    assert not (out / "cpu-smoke-json" / "xconf.log").exists()
    # xconf-run: an application key, never part of the experiment document.
    from omegaconf import DictConfig, OmegaConf

    from xconf.config.hydra_document import experiment_document

    cfg = OmegaConf.load(REPO / "conf" / "config.yaml")
    assert isinstance(cfg, DictConfig)
    assert cfg.verbose is False
    cfg.merge_with({"verbose": True, "experiment_id": "x"})
    assert "verbose" not in experiment_document(cfg)
