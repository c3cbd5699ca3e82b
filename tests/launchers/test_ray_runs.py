"""``hydra/launcher=xconf_ray`` on the real local two-node cluster (scripts/ray-up): S0 and a
two-rank S1 case give the torchrun launcher's verdicts and scores, bit for bit; a two-rank
world spans both nodes; no rank actor outlives its case; a world the cluster cannot hold is
refused before anything is submitted."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.adapters.conftest import needs_vllm
from tests.launchers.ray_fixture import rank_actors
from tests.launchers.test_s0_multirun import (
    SHARDING,
    SMOKE,
    assert_bitwise_equal,
    case_dirs,
    verdicts,
    xconf_run,
)

S1 = ["+experiment=s1_cpu_fsdp", "runtime=hf_pair", "interventions=[]", "training.sharding=fsdp"]
TENSORS = "score_rollout.safetensors"


def sweep(tmp: Path, name: str, launcher: list[str], *overrides: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = xconf_run(
        tmp,
        *overrides,
        *launcher,
        f"output_root={tmp / name / 'out'}",
        f"hydra.sweep.dir={tmp / name / 'mr'}",
    )
    return done.returncode, done.stdout[-3000:] + done.stderr[-3000:], time.monotonic() - started


def on_ray(address: str) -> list[str]:
    return ["hydra/launcher=xconf_ray", f"hydra.launcher.address={address}"]


def launches(sweep_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/launch.json"))]


def assert_same_runs(ray_out: Path, torchrun_out: Path, experiment: str) -> None:
    """The same cases, the same verdicts (every field of comparison.json), the same bits."""
    ray_cases, torchrun_cases = case_dirs(ray_out, experiment), case_dirs(torchrun_out, experiment)
    assert ray_cases.keys() == torchrun_cases.keys()
    for case, attempt in ray_cases.items():
        ours = json.loads((attempt / "comparison.json").read_text())
        theirs = json.loads((torchrun_cases[case] / "comparison.json").read_text())
        assert ours == theirs, case
        if (attempt / TENSORS).exists() or (torchrun_cases[case] / TENSORS).exists():
            assert_bitwise_equal(attempt, torchrun_cases[case])


def no_rank_actor_left(bound_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + bound_s
    while (left := rank_actors()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
def test_s0_on_ray_gives_the_torchrun_verdicts_bit_for_bit(
    ray_cluster: str,
    tmp_path: Path,
) -> None:
    code, ray_out, took = sweep(tmp_path, "ray", on_ray(ray_cluster), *SMOKE, SHARDING)
    print(f"S0 on Ray, 2 cases (1 and 2 ranks): {took:.1f} s")
    assert code == 1, ray_out
    code, out, _ = sweep(tmp_path, "torchrun", ["hydra/launcher=torchrun"], *SMOKE, SHARDING)
    assert code == 1, out
    results = verdicts(tmp_path / "ray" / "out")
    assert sorted(v["result"] for v in results.values()) == ["error", "pass"]
    assert_same_runs(tmp_path / "ray" / "out", tmp_path / "torchrun" / "out", "cpu-smoke")
    ray_launches = launches(tmp_path / "ray" / "mr")
    assert sorted(r["world_size"] for r in ray_launches) == [1, 2]
    assert {r["status"] for r in ray_launches} == {"completed"}
    # The two-rank world has a bundle on each node (each node holds one logical CPU).
    (two,) = [
        json.loads(p.read_text())
        for p in (tmp_path / "ray" / "mr").glob("*/ray_placement.json")
        if len(json.loads(p.read_text())["ranks"]) == 2
    ]
    assert len({r["node_id"] for r in two["ranks"]}) == 2, two
    # Each rank's own output went to its case's log, not the terminal.
    assert list((tmp_path / "ray" / "mr").glob("*/ray_rank1.out"))
    assert "rank 1/2 running case" not in ray_out
    assert "rank 1/2 running case" in (tmp_path / "ray" / "mr" / "1" / "ray_rank1.out").read_text()
    assert no_rank_actor_left() == []


@needs_vllm
@pytest.mark.slow
def test_two_rank_s1_case_on_ray_gives_the_torchrun_verdict_bit_for_bit(
    ray_cluster: str,
    tmp_path: Path,
) -> None:
    code, out, took = sweep(tmp_path, "ray", on_ray(ray_cluster), *S1)
    print(f"S1 fsdp (2 ranks) on Ray: {took:.1f} s")
    assert code == 0, out
    code, out, took = sweep(tmp_path, "torchrun", ["hydra/launcher=torchrun"], *S1)
    print(f"S1 fsdp (2 ranks) under torchrun: {took:.1f} s")
    assert code == 0, out
    assert [v["result"] for v in verdicts_of(tmp_path / "ray" / "out")] == ["pass"]
    assert_same_runs(tmp_path / "ray" / "out", tmp_path / "torchrun" / "out", "s1-cpu-fsdp")
    (attempt,) = case_dirs(tmp_path / "ray" / "out", "s1-cpu-fsdp").values()
    training = json.loads((attempt / "actual.json").read_text())["readback"]["training"]
    assert training["training.world_size"] == 2
    assert [r["world_size"] for r in launches(tmp_path / "ray" / "mr")] == [2]
    assert no_rank_actor_left() == []


def verdicts_of(out: Path) -> list[dict]:
    return [
        json.loads((a / "comparison.json").read_text())
        for a in case_dirs(out, "s1-cpu-fsdp").values()
    ]


def test_a_world_larger_than_the_cluster_is_refused_before_submission(
    ray_cluster: str,
    tmp_path: Path,
) -> None:
    code, out, _ = sweep(
        tmp_path, "big", on_ray(ray_cluster), *SMOKE, "rollout.tensor_parallel_size=1,4"
    )
    assert code == 2, out
    assert "xconf: error [launch.ray.world_too_large]" in out
    assert "Ray cluster has 2 node(s) of 1 CPUs" in out
    assert not (tmp_path / "big" / "mr" / "0").exists()  # not even the case that fits
