"""Checks Hydra runs before it creates its own output directory (a Hydra callback).

Hydra makes ``hydra.run.dir`` (``hydra.sweep.dir`` under ``-m``) and writes its config
there before xconf's task starts. Bad values are refused first, so a coded exit 2 writes
nothing at all: the application's own values (``xconf.config.hydra_document``), the
sealed fields' interpolations, and a Hydra output directory that cannot be one (a file,
or a path through a file: Hydra's ``mkdir`` would end in a ``FileExistsError`` traceback).
"""

from __future__ import annotations

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
    except XconfError as exc:
        report_error(exc)
        sys.exit(2)  # a SystemExit: Hydra passes it through, nothing was written


class InputChecks(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.sweep.dir")
