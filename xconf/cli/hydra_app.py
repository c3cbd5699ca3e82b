"""`xconf-run`: the Hydra application. `xconf-run +experiment=cpu_smoke [mode=plan] [k=v ...]`.

Exit codes: 0 every case passed (or plan-only), 1 a non-pass verdict, 2 invalid input
(including a configuration Hydra itself could not compose).

The flow itself is :mod:`xconf.session`'s; this module turns a composed config into its
inputs. Heavy imports (torch, the runner, the adapters) stay out of module level: `--help`,
`--cfg` and ``mode=plan`` never need them.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf

from xconf import session
from xconf.runtime.loading import conf_dir
from xconf.session import EXIT_INVALID, EXIT_OK, Outcome

if TYPE_CHECKING:
    from xconf.cli.render import ConsoleView


def _outcome(cfg: DictConfig, overrides: list[str], runtime_choice: str | None) -> Outcome:
    from xconf.cli.render import ConsoleView
    from xconf.config.hydra_document import experiment_document, reject_config_set_cli_keys
    from xconf.config.strict import parse_experiment

    view = ConsoleView()

    def step() -> Outcome:
        reject_config_set_cli_keys(cfg, overrides, runtime_choice)
        spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
        if cfg.mode == "plan":
            output_root = hydra.utils.to_absolute_path(str(cfg.output_root))
            return session.plan(spec, output_root=output_root, view=view, runtime=cfg.runtime)
        from xconf.cli import fix
        from xconf.cli.localize import after_verdict

        hooks = after_verdict(bool(cfg.get("localize")), view.localized, view.localize_failed)
        return session.run(
            spec,
            OmegaConf.to_container(cfg.runtime, resolve=True),  # type: ignore[arg-type]
            session.RunOptions.from_config(cfg),
            view=view,
            # localize first: the fix search reads the baseline's sealed localization
            after_verdict=(*hooks, *fix.after_verdict(bool(cfg.get("fix")), view.console)),
        )

    return session.guarded(step)


def run_from_config(cfg: DictConfig, overrides: list[str], runtime_choice: str | None) -> int:
    """Plan or run the experiment composed in ``cfg``; returns the exit code."""
    return _outcome(cfg, overrides, runtime_choice).exit_code


class HydraTask:
    """The task Hydra calls: one per `xconf-run` invocation, holding that invocation's outcome.

    Under ``-m`` Hydra runs the xconf sweeper instead; it draws the sweep on
    :meth:`sweep_view` and hands the sweep's outcome back through :meth:`receive` (the task
    is an :class:`~xconf.session.OutcomeReceiver`).
    """

    def __init__(self) -> None:
        self.started = False
        self.outcome: Outcome | None = None

    def sweep_view(self) -> ConsoleView:
        from xconf.cli.render import ConsoleView

        return ConsoleView()

    def receive(self, outcome: Outcome) -> None:
        self.started = True
        self.outcome = outcome

    def __call__(self, cfg: DictConfig) -> Any:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        self.started = True
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode == RunMode.MULTIRUN:
            from xconf.cli.multirun_job import run_sweep_job

            return run_sweep_job(cfg)
        choice = hydra_cfg.runtime.choices.get("runtime")
        # The raw override strings: never resolve a ${...} they contain.
        raw = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)
        overrides = [str(o) for o in raw] if isinstance(raw, list) else []
        self.outcome = _outcome(cfg, overrides, choice)
        if self.outcome.exit_code == EXIT_INVALID:  # a refusal writes nothing, Hydra's dir too
            from xconf.cli.hydra_checks import discard_run_dir

            discard_run_dir(hydra_cfg.runtime.output_dir, hydra_cfg.job.name)
        return self.outcome.exit_code


def _too_deep(argv: list[str]) -> str | None:
    """An override nested deeper than documents may be (Hydra's own override parser recurses
    per bracket and would end in a ``RecursionError`` traceback): the first such override."""
    from xconf.config.strict import MAX_DEPTH

    for arg in argv:
        depth = deepest = 0
        for char in arg:
            depth += (char in "[{(") - (char in "]})")
            deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return arg.split("=", 1)[0]
    return None


def _too_long_number(argv: list[str]) -> str | None:
    """An override holding an integer longer than Python converts (Hydra's parser would end
    in a ``ValueError`` traceback): the first such override's key."""
    import re

    limit = sys.get_int_max_str_digits() or None
    for arg in argv:
        if limit is not None and re.search(rf"\d{{{limit + 1},}}", arg):
            return arg.split("=", 1)[0]
    return None


def _unparsable(argv: list[str]) -> tuple[str, str] | None:
    """The first override Hydra's grammar refuses (a character outside it, such as a Cyrillic
    letter in a knob path), as (key, why): Hydra would print its own uncoded message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            parser.parse_overrides([arg])
        except HydraException as exc:
            why = str(exc).splitlines()[0]
            return arg.split("=", 1)[0], why
    return None


def _refusal(argv: list[str]) -> str | None:
    """The coded error for an override no config may hold, before Hydra parses it."""
    deep = _too_deep(argv)
    if deep is not None:
        return (
            f"[config.too_deep] at '{deep.lstrip('+~')}': the override is nested deeper than "
            "documents may be"
        )
    long = _too_long_number(argv)
    if long is not None:
        return (
            f"[config.too_large] at '{long.lstrip('+~')}': the override holds a number longer "
            "than any value may be"
        )
    bad = _unparsable(argv)
    if bad is not None:
        from xconf.shown_text import shown

        return shown(f"[config.bad_override] at '{bad[0].lstrip('+~')}': {bad[1]}")
    return None


def main() -> None:
    refused = _refusal(sys.argv[1:])
    if refused is not None:
        print(f"xconf: error {refused}", file=sys.stderr)
        sys.exit(EXIT_INVALID)
    task = HydraTask()
    app = hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
    try:
        # A bound method, so Hydra finds this module's file and name (job name, python -m).
        app(task.__call__)()
    except SystemExit as exc:
        # Hydra exits 1 when it cannot compose the config: that is invalid input.
        if not task.started and exc.code not in (0, None):
            sys.exit(EXIT_INVALID)
        raise
    sys.exit(task.outcome.exit_code if task.outcome is not None else EXIT_OK)


if __name__ == "__main__":
    main()
