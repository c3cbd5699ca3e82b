"""Runtime adapters built by hydra.utils.instantiate from their config group, with coded
errors for options they do not take."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.errors import ConfigError, XconfError
from xconf.operators.catalog import load_object
from xconf.runtime.loading import instantiate_runtime, load_runtime_config

CONF = Path(__file__).resolve().parents[2] / "conf"
SMOKE = "xconf.adapters.cpu_smoke.adapter:CpuSmokeRuntime"


class Picky:
    """A runtime whose constructor validates its own option with a typed error."""

    def __init__(self, level: int, *, tags: list[str] | None = None) -> None:
        if level < 0:
            raise XconfError("runtime.bad_level", "level must be >= 0", "runtime.level")
        self.level = level
        self.tags = tags


PICKY = f"{__name__}:Picky"


def test_config_group_file_with_overrides_builds_the_adapter() -> None:
    config = load_runtime_config(CONF, "cpu-smoke", ["runtime.seed=3", "++runtime.vocab_size=50"])
    adapter = instantiate_runtime(config)
    assert isinstance(adapter, CpuSmokeRuntime)
    assert adapter.model_config.seed == 3 and adapter.model_config.vocab_size == 50


@pytest.mark.parametrize(
    "config",
    [
        {"_target_": SMOKE, "model_path": "x"},
        {"_target_": SMOKE, "seed": 1, "model_path": "x", "zz": 1},
    ],
)
def test_unknown_option_names_the_key(config) -> None:
    with pytest.raises(ConfigError) as info:
        instantiate_runtime(config)
    assert info.value.code == "runtime.unknown_option"
    assert info.value.path == "runtime.model_path"
    assert "runtime.model_path" in info.value.message


def test_overrides_follow_hydra_grammar_restricted_to_runtime() -> None:
    with pytest.raises(ConfigError) as unknown:
        load_runtime_config(CONF, "cpu_smoke", ["runtime.model_path=x"])
    assert (unknown.value.code, unknown.value.path) == (
        "runtime.unknown_option",
        "runtime.model_path",
    )
    added = load_runtime_config(CONF, "cpu_smoke", ["+runtime.model_path=x"])
    assert added.model_path == "x"  # composes, like Hydra; instantiation then refuses it
    for bad, path in (
        ("+runtime.seed=1", "runtime.seed"),
        ("batch.size=2", "batch.size"),
        ("runtime.seed=1,2", "runtime.seed"),
        ("~runtime.seed", "runtime.seed"),
    ):
        with pytest.raises(ConfigError) as info:
            load_runtime_config(CONF, "cpu_smoke", [bad])
        assert (info.value.code, info.value.path) == ("runtime.bad_override", path), bad


def test_missing_option_and_typed_adapter_errors_stay_coded() -> None:
    with pytest.raises(ConfigError) as missing:
        instantiate_runtime({"_target_": PICKY})
    assert (missing.value.code, missing.value.path) == ("runtime.missing_option", "runtime.level")
    with pytest.raises(XconfError) as own:
        instantiate_runtime({"_target_": PICKY, "level": -1})
    assert own.value.code == "runtime.bad_level"
    built = instantiate_runtime(OmegaConf.create({"_target_": PICKY, "level": 2, "tags": ["a"]}))
    assert built.level == 2 and built.tags == ["a"] and type(built.tags) is list


def test_unknown_target_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        instantiate_runtime({"_target_": "xconf.adapters.nope:Runtime"})
    assert info.value.code == "runtime.unknown_target"
    with pytest.raises(ConfigError) as none:
        instantiate_runtime({"seed": 1})
    assert none.value.code == "runtime.no_target"


def test_catalog_factories_load_through_hydra_in_both_spellings() -> None:
    assert load_object(SMOKE) is CpuSmokeRuntime
    assert load_object(SMOKE.replace(":", ".")) is CpuSmokeRuntime
