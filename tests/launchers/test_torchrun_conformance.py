"""Hydra's own launcher suites, opted into the way Hydra's official plugins do it."""

from __future__ import annotations

import subprocess
import sys

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from pytest import mark

from hydra_plugins.xconf_torchrun_launcher.torchrun_launcher import TorchrunLauncher


def test_discovery() -> None:
    names = [x.__name__ for x in Plugins.instance().discover(Launcher)]
    assert TorchrunLauncher.__name__ in names


@mark.parametrize("launcher_name, overrides", [("torchrun", [])])
class TestTorchrunLauncher(LauncherTestSuite):
    pass


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
