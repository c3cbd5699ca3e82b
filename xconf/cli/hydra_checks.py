"""Checks Hydra runs before it creates its own output directory (a Hydra callback).

Hydra makes ``hydra.run.dir`` (``hydra.sweep.dir`` under ``-m``) and writes its config
there before xconf's task starts. Bad values are refused first, so a coded exit 2 writes
nothing at all: the application's own values (``xconf.config.hydra_document``), the
sealed fields' interpolations, an xconf launcher's settings (``hydra.launcher.*``: before
the sweep plans anything), and a Hydra output directory that cannot be one (a file, or a
path through a file: Hydra's ``mkdir`` would end in a ``FileExistsError`` traceback).

What only the task can refuse (an identity, a runtime option, a checkpoint) is refused
after Hydra made its run directory: the task then removes it again
(:func:`discard_run_dir`), Hydra's own files and the directories it created, when nothing
else was written there, so a refusal still leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from xconf.errors import ConfigError, XconfError


def check_output_dir(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None:
        return
    path = Path(str(value))
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            if not candidate.is_dir():
                raise ConfigError(
                    "config.invalid_value",
                    f"{key} is {path}, but {candidate} exists and is not a directory",
                    key,
                )
            return


# xconf's launchers: their settings class, checked before anything is planned or written.
LAUNCHER_SETTINGS = {
    "hydra_plugins.xconf_ray_launcher.ray_launcher.XconfRayLauncher": (
        "xconf.launchers.ray_cluster",
        "RaySettings",
    ),
    "hydra_plugins.xconf_torchrun_launcher.torchrun_launcher.TorchrunLauncher": (
        "xconf.launchers.world",
        "WorldSettings",
    ),
}
# Hydra's run directories this process is about to create: the run directory, and the
# top-most of its ancestors that did not exist yet (what a refusal removes again).
_FRESH: dict[str, Path] = {}


def check_launcher(cfg: DictConfig) -> None:
    """An xconf launcher's settings (``hydra.launcher.*``) as its launcher checks them."""
    import importlib

    target = OmegaConf.select(cfg, "hydra.launcher._target_")
    if target not in LAUNCHER_SETTINGS:
        return
    module, name = LAUNCHER_SETTINGS[target]
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    if not isinstance(params, dict):
        return
    settings = getattr(importlib.import_module(module), name)(
        **{str(k): v for k, v in params.items() if k != "_target_"}
    )
    settings.validate()


def _check(cfg: DictConfig, key: str) -> None:
    from xconf.config.hydra_document import check_app_values, check_sealed_fields
    from xconf.config.strict import check_contract_source
    from xconf.session import report_error

    try:
        check_output_dir(cfg, key)
        check_app_values(cfg)
        check_sealed_fields(cfg)
        if "contract_source" in cfg:
            check_contract_source(cfg.contract_source)
        if key == "hydra.sweep.dir":
            check_launcher(cfg)
    except XconfError as exc:
        report_error(exc)
        sys.exit(2)  # a SystemExit: Hydra passes it through, nothing was written


def _remember_fresh(cfg: DictConfig) -> None:
    value = OmegaConf.select(cfg, "hydra.run.dir")
    if value is None:
        return
    path = Path(os.path.abspath(str(value)))
    top = None
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            break
        top = candidate
    if top is not None:
        _FRESH[str(path)] = top


def discard_run_dir(run_dir: str, job_name: str) -> None:
    """Remove what Hydra wrote for a refused run when it created the directory for it: its
    ``.hydra/`` files and the job's log, then every directory it made, each only when
    nothing else is in it."""
    path = Path(os.path.abspath(run_dir))
    top = _FRESH.pop(str(path), None)
    if top is None:
        return  # the directory was there before: it is the user's
    _detach_file_handlers(path)
    hydra = path / ".hydra"
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        _unlink_file(hydra / name)
    _unlink_file(path / f"{job_name}.log")
    for folder in (hydra, path, *path.parents):
        try:
            folder.rmdir()  # only when empty
        except OSError:
            return
        if folder == top:
            return


def _detach_file_handlers(folder: Path) -> None:
    """Close and remove every logging handler that writes into ``folder``.

    Hydra's job logging puts a FileHandler for ``<run dir>/<job>.log`` on the root logger
    and never takes it off. Once the directory is gone, a handler that anything closed in
    the meantime (``logging.config.dictConfig`` closes every handler it did not make) opens
    its file again on the next record and raises ``FileNotFoundError`` into whoever logged:
    in a process that goes on after the refusal (an in-process caller, a test session),
    every later log line at that level would fail.
    """
    loggers = [logging.getLogger()]
    loggers += [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for logger in loggers:
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(
                handler.baseFilename
            ).is_relative_to(folder):
                logger.removeHandler(handler)
                handler.close()


def _unlink_file(path: Path) -> None:
    try:
        if path.is_file() and not path.is_symlink():
            path.unlink()
    except OSError:
        pass


class InputChecks(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.run.dir")
        _remember_fresh(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.sweep.dir")
