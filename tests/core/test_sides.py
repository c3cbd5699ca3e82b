"""A runtime config pairs two sides by package name; a name that is no side, a side in the
other slot, or two sides that cannot score one model are coded errors naming the option."""

from __future__ import annotations

import pytest

from xconf.errors import ConfigError
from xconf.runtime.loading import instantiate_runtime, runtime_config
from xconf.runtime.pairing import SidePair
from xconf.runtime.side import resolve_side, side_packages


def test_the_shipped_runtimes_pair_the_sides_their_configs_name() -> None:
    kinds = {}
    for name in ("vllm_hf", "hf_pair", "cpu_smoke"):
        runtime = instantiate_runtime(runtime_config(name))
        kinds[name] = (runtime.runtime_kind, runtime.sides.names, runtime.max_cached_engines)
    assert kinds == {
        "vllm_hf": ("vllm-hf", ("vllm", "hf"), {"rollout": 1, "training": 4}),
        "hf_pair": ("hf-pair", ("hf", "hf"), {"rollout": 2, "training": 4}),
        "cpu_smoke": ("cpu-smoke", ("cpu_smoke", "cpu_smoke"), {"rollout": 4, "training": 4}),
    }


def test_every_side_package_declares_its_slots() -> None:
    assert {"cpu_smoke", "hf", "vllm"} <= set(side_packages())
    for name in side_packages():
        found = [slot for slot in ("rollout", "training") if _has(name, slot)]
        assert found, name


def _has(name: str, slot: str) -> bool:
    try:
        spec = resolve_side(name, slot)  # type: ignore[arg-type]
    except ConfigError as exc:
        assert exc.code == "runtime.no_such_side"
        return False
    assert (spec.name, spec.side) == (name, slot)
    return True


@pytest.mark.parametrize(
    ("override", "code", "path"),
    [
        ("runtime.rollout=nope", "runtime.unknown_side", "runtime.rollout"),
        ("runtime.rollout=../etc", "runtime.bad_side", "runtime.rollout"),
        ("runtime.rollout=Vllm", "runtime.bad_side", "runtime.rollout"),
        ("runtime.training=vllm", "runtime.no_such_side", "runtime.training"),
        ("runtime.training=cpu_smoke", "runtime.sides_unpaired", "runtime.training"),
    ],
)
def test_a_bad_pairing_is_a_coded_error(override: str, code: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        instantiate_runtime(runtime_config("vllm_hf", [override]))
    assert (info.value.code, info.value.path) == (code, path)


def test_the_unknown_side_error_lists_the_side_packages() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_side("nope", "rollout")
    assert all(name in info.value.message for name in ("cpu_smoke", "hf", "vllm"))


def test_a_side_in_the_other_slot_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        SidePair(resolve_side("hf", "training"), resolve_side("hf", "training"))
    assert (info.value.code, info.value.path) == ("runtime.side_slot", "runtime.rollout")


def test_the_kind_is_the_configs_or_the_two_side_names() -> None:
    pair = instantiate_runtime(runtime_config("hf_pair", ["runtime.kind=null"]))
    assert pair.runtime_kind == "hf-hf"


def test_the_synthetic_runtime_pairs_only_the_synthetic_sides() -> None:
    with pytest.raises(ConfigError) as info:
        instantiate_runtime(runtime_config("cpu_smoke", ["runtime.rollout=hf"]))
    assert (info.value.code, info.value.path) == ("runtime.sides_unpaired", "runtime.training")
