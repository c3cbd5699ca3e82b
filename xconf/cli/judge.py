"""`xconf judge FILE... | --case NAME=FILE`: judge dumped logprobs and seal them as a run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from xconf.errors import XconfError


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "judge",
        help="judge rollout vs training logprobs dumped by another system (safetensors, "
        "npz, Parquet); each file one sealed case",
    )
    parser.add_argument("files", nargs="*", type=Path, help="dump files (case name: file stem)")
    parser.add_argument(
        "--case", action="append", default=[], metavar="NAME=FILE", help="a named case"
    )
    parser.add_argument("--rollout-key", default="rollout_log_probs")
    parser.add_argument("--training-key", default="old_log_probs")
    parser.add_argument("--mask-key", default="response_mask")
    parser.add_argument(
        "--dtype", default=None, help="both sides' compute dtype (picks the threshold)"
    )
    parser.add_argument("--rollout-dtype", default=None)
    parser.add_argument("--training-dtype", default=None)
    figures = parser.add_argument_group(
        "verl importance weights (diagnostics only; they never vote)",
        "verl's algorithm.rollout_correction IS/RS settings: judge records the "
        "rollout_corr/rollout_is_* and rollout_rs_* figures verl logs with them",
    )
    figures.add_argument("--rollout-is", choices=("token", "sequence"), default=None)
    figures.add_argument(
        "--rollout-is-threshold", default="2.0", help="TIS upper bound, or 'lower_upper' (IcePop)"
    )
    figures.add_argument("--rollout-is-batch-normalize", action="store_true")
    figures.add_argument("--rollout-rs", default=None, help="e.g. token_k1,seq_mean_k3")
    figures.add_argument("--rollout-rs-threshold", default=None)
    parser.add_argument("--experiment-id", default="judge")
    parser.add_argument("--output-root", default="outputs")
    parser.add_argument("--no-resume", action="store_true", help="judge again even if sealed")


def _named(args: argparse.Namespace) -> list[tuple[str, Path]]:
    named = [(f.stem, f) for f in args.files]
    for item in args.case:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise XconfError("judge.bad_case", f"--case {item!r} is not NAME=FILE", "--case")
        named.append((name, Path(file)))
    if not named:
        raise XconfError("judge.no_input", "give dump files or --case NAME=FILE", "files")
    names = [n for n, _ in named]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise XconfError(
            "judge.duplicate_case",
            f"case names {dupes} appear twice; use --case NAME=FILE",
            "--case",
        )
    return named


def _correction(args: argparse.Namespace) -> Any:
    """The IS/RS settings, checked as verl checks them; None when neither is configured."""
    from xconf.rollout_correction import Correction
    from xconf.rollout_correction.weights import check_correction

    if args.rollout_is is None and args.rollout_rs is None:
        return None
    correction = Correction(
        rollout_is=args.rollout_is,
        rollout_is_threshold=args.rollout_is_threshold,
        rollout_is_batch_normalize=args.rollout_is_batch_normalize,
        rollout_rs=args.rollout_rs,
        rollout_rs_threshold=args.rollout_rs_threshold,
    )
    check_correction(correction)
    return correction


def run(args: argparse.Namespace, console: Any) -> int:
    from xconf.artifacts.store import ExperimentStore
    from xconf.cli.render import print_reasons, verdict_table
    from xconf.judge.dumps import Keys, load_dump
    from xconf.judge.seal import judge_cases, resolve_dtypes
    from xconf.report.writer import report_after_run
    from xconf.session import exit_code

    keys = Keys(rollout=args.rollout_key, training=args.training_key, mask=args.mask_key)
    correction = _correction(args)
    # Every file is read and checked before anything is written.
    cases = [
        resolve_dtypes(
            load_dump(name, file, keys),
            args.dtype,
            args.rollout_dtype,
            args.training_dtype,
            correction,
        )
        for name, file in _named(args)
    ]
    store = ExperimentStore(args.output_root, args.experiment_id)
    summary = judge_cases(store, cases, resume=not args.no_resume)
    files = [(case.case_id, case.dump.path) for case in cases]
    del cases  # the dumps' tensors: what follows reads the sealed attempts alone
    console.print(verdict_table(summary))
    print_reasons(console, summary.records)
    _print_replay(console, files, summary.records)
    report_after_run(summary.experiment_dir, console)
    return exit_code(summary.records)


def _print_replay(console: Any, files: list[tuple[str, str]], records: list[Any]) -> None:
    """For each failing dump that carries its token ids: the command that attributes it."""
    from xconf.adapters.frozen_dump import replay_command

    for (case_id, path), record in zip(files, records, strict=True):
        if record.result != "fail":
            continue
        command = replay_command(path)
        if command is None:
            continue
        console.print(
            f"{case_id}: find the knob that causes it (replays the dump's own tokens, "
            "one knob at a time, on your checkpoint):",
            markup=False,
            highlight=False,
        )
        console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)
