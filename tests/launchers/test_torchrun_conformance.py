"""Hydra's own launcher suites, opted into the way Hydra's official plugins do it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import DictConfig, OmegaConf
from pytest import mark

from hydra_plugins.xconf_torchrun_launcher.torchrun_launcher import TorchrunLauncher


def test_discovery() -> None:
    names = [x.__name__ for x in Plugins.instance().discover(Launcher)]
    assert TorchrunLauncher.__name__ in names


def task_returning_100(_: Any) -> int:
    """The suite's own task function, at module level: ranks import it by name (no pickle)."""
    return 100


def task_returning_x(cfg: DictConfig) -> Any:
    return cfg.x


@mark.parametrize("launcher_name, overrides", [("torchrun", [])])
class TestTorchrunLauncher(LauncherTestSuite):
    """Upstream's suite; its task functions are closures, which only a pickle of code could
    hand to a rank (ranks import the task by name), so they are module-level here."""

    def get_task_function(self) -> Callable[[Any], Any]:
        return task_returning_100

    def test_sweep_with_custom_resolver(
        self,
        hydra_sweep_runner: TSweepRunner,
        launcher_name: str,
        overrides: list[str],
        tmpdir: Path,
    ) -> None:
        # Upstream's test with its closure replaced; the resolver exists only in the parent,
        # which resolves the job's config before the ranks start.
        sweep = hydra_sweep_runner(
            calling_file=None,
            calling_module="hydra.test_utils.a_module",
            task_function=task_returning_x,
            config_path="configs",
            config_name="custom_resolver",
            overrides=["hydra/launcher=" + launcher_name, *overrides],
            temp_dir=tmpdir,
        )
        OmegaConf.register_new_resolver("my_custom_resolver", lambda: "foo")
        with sweep:
            assert sweep.returns is not None
            (job_ret,) = sweep.returns[0]
            assert job_ret.return_value == "foo"


@mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/launcher=torchrun"])],
)
class TestTorchrunLauncherIntegration(IntegrationTestSuite):
    pass


def test_discovery_in_fresh_interpreter_is_light() -> None:
    """Discovery from scratch (as `xconf-run` does it) finds the plugin without importing torch."""
    code = (
        "import sys\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "names = [x.__name__ for x in Plugins.instance().discover(Launcher)]\n"
        "assert 'TorchrunLauncher' in names, names\n"
        "assert 'XconfSlurmLauncher' in names and 'XconfLocalLauncher' in names, names\n"
        "assert 'torch' not in sys.modules, 'plugin discovery imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
