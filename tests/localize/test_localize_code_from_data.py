"""A run directory never chooses code: `xconf localize` builds the runtime the installed
catalog names, whatever materialized.json and actual.json say (fourth campaign).

Each attack edits a sealed S0 attempt and reseals it (every digest recomputed), pointing
localize at a YAML file of the directory's choosing, or smuggling a Hydra key or an
interpolation into the recorded constructor options. Before: the YAML was loaded and its
`_target_` (`builtins.open(..., "w")`) ran; a nested `_target_` in an option was built by
`instantiate`. Now each is a coded exit 2 and the marker file is never created."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import snapshot
from tests.core.runs import only, run_doc
from tests.truth.forgery import edit_json
from xconf.errors import ConfigError


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, _s0_cached: dict[str, Any]) -> Path:
    """An S0 run of the baseline alone; its attempt is the one localize is pointed at."""
    doc = only(copy.deepcopy(_s0_cached))
    summary = run_doc(doc, tmp_path_factory.mktemp("s0"))
    return Path(summary.experiment_dir)


def _copy(sealed: Path, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    run = tmp_path / sealed.name
    shutil.copytree(sealed, run)
    (attempt,) = (run / "cases").glob("*/a-0001")
    return run, attempt


@pytest.fixture
def folder() -> Iterator[Path]:
    """A directory whose path holds no '-' (the loader spells '-' as '_': a hyphen in the
    path would hide the attack)."""
    import shutil
    import tempfile

    made = Path(tempfile.mkdtemp(prefix="xconfevil", dir="/tmp"))
    assert "-" not in str(made)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _evil_yaml(folder: Path, marker: Path) -> Path:
    """A YAML file whose `_target_` writes ``marker``."""
    evil = folder / "evil.yaml"
    evil.write_text(f"_target_: builtins.open\nfile: {marker}\nmode: w\n")
    return evil


def _kind(value: Callable[[Path], str]) -> Callable[[Path, Path, Path], None]:
    def attack(folder: Path, attempt: Path, marker: Path) -> None:
        evil = _evil_yaml(folder, marker)
        edit_json(
            attempt,
            "materialized.json",
            lambda d: d.update(runtime_kind=value(evil)),
        )

    return attack


def _option(option: dict[str, Any]) -> Callable[[Path, Path, Path], None]:
    def attack(folder: Path, attempt: Path, marker: Path) -> None:
        def edit(doc: dict[str, Any]) -> None:
            runtime = doc["provenance"]["runtime"]
            runtime["options"] = {**runtime["options"], **option}

        edit_json(attempt, "actual.json", edit)

    return attack


def _opener(marker_name: str = "MARKER") -> dict[str, Any]:
    return {"_target_": "builtins.open", "file": marker_name, "mode": "w"}


ATTACKS = {
    # the runtime_kind an absolute path to a YAML file (".yaml" is added by the loader)
    "absolute_yaml_path": (_kind(lambda evil: str(evil.with_suffix(""))), "config.unknown_runtime"),
    "relative_escape": (
        _kind(lambda evil: "../../../../../../../../.." + str(evil.with_suffix(""))),
        "config.unknown_runtime",
    ),
    "yaml_file_name": (_kind(lambda evil: str(evil)), "config.unknown_runtime"),
    "nested_target_in_option": (_option({"seed": _opener()}), "runtime.reserved_key"),
    "partial_key": (_option({"_partial_": True}), "runtime.reserved_key"),
    "interpolation": (_option({"seed": "${oc.env:HOME}"}), "runtime.interpolation"),
    # the recorded sides are not the catalog config's: another side package, or a path
    "other_side": (_option({"rollout": "hf"}), "localize.runtime_mismatch"),
    "side_path": (_option({"training": "../../../tmp/evil"}), "localize.runtime_mismatch"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_run_directory_chooses_no_code(
    name, sealed, tmp_path, folder, xconf_cli, monkeypatch
) -> None:
    attack, code = ATTACKS[name]
    run, attempt = _copy(sealed, tmp_path)
    marker = tmp_path / "MARKER"
    monkeypatch.chdir(tmp_path)  # a relative `file: MARKER` lands here
    attack(folder, attempt, marker)
    before = snapshot(run)
    rc, _, err = xconf_cli("localize", run, attempt.parent.name)
    assert not marker.exists(), f"{name}: code chosen by the run directory ran"
    assert rc == 2 and f"[{code}]" in err, err[-2000:]
    assert snapshot(run) == before


def test_catalog_is_the_installed_one() -> None:
    from xconf.runtime.loading import catalog_runtime, runtime_names

    assert set(runtime_names(Path(__file__).resolve().parents[2] / "conf")) >= {
        "cpu_smoke",
        "hf_pair",
        "vllm_hf",
    }
    for name in ("/etc/passwd", "..", "cpu_smoke/../vllm_hf", "", "cpu.smoke", None, 3):
        with pytest.raises(ConfigError) as info:
            catalog_runtime(name)
        assert info.value.code == "config.unknown_runtime"
    assert catalog_runtime("cpu-smoke", {"seed": 4}).model_config.seed == 4
    for side in ({"rollout": "hf"}, {"training": "/tmp/evil"}, {"rollout": None}):
        with pytest.raises(ConfigError) as info:
            catalog_runtime("cpu_smoke", side)
        assert info.value.code == "runtime.side_mismatch", side
    assert catalog_runtime("cpu_smoke", {"rollout": "cpu_smoke"}).model_config.seed == 0


@pytest.mark.parametrize(
    "options, code",
    [
        ({"model": {"path": {"_target_": "os.getcwd"}}}, "runtime.reserved_key"),
        ({"tags": [{"_args_": [1]}]}, "runtime.reserved_key"),
        ({"model": {"path": "${now:%Y}"}}, "runtime.interpolation"),
    ],
)
def test_option_data_holds_no_hydra_key(options, code) -> None:
    from xconf.runtime.loading import check_option_data

    with pytest.raises(ConfigError) as info:
        check_option_data(options)
    assert info.value.code == code
