"""Artifact store: atomic, append-only publication, sealing, verification, resume discovery."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from xconf.artifacts import safe_io
from xconf.artifacts.store import (
    PAYLOAD_FILES,
    SEAL_NAME,
    ExperimentStore,
    read_tensors,
)
from xconf.errors import ArtifactError

KEY = "k" * 64
CASE = "c-0123456789abcdef"


def publish(store: ExperimentStore, result: str = "pass", key: str = KEY):
    documents = {
        name: {"name": name, "result": result} for name in PAYLOAD_FILES if name.endswith(".json")
    }
    tensors = {
        name: {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
        for name in PAYLOAD_FILES
        if name.endswith(".safetensors")
    }
    return store.publish_attempt(CASE, key, documents, tensors, result)


@pytest.fixture
def store(tmp_path: Path) -> ExperimentStore:
    return ExperimentStore(tmp_path / "out", "exp-1")


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# -- publication -----------------------------------------------------------------------------


def test_publish_seals_every_payload_last(store) -> None:
    attempt = publish(store)
    assert attempt.attempt_id == "a-0001"
    names = sorted(p.name for p in attempt.path.iterdir())
    assert names == sorted([*PAYLOAD_FILES, SEAL_NAME])
    seal = json.loads((attempt.path / SEAL_NAME).read_text())
    assert seal["files"] == {n: safe_io.sha256_file(attempt.path / n) for n in PAYLOAD_FILES}
    assert (seal["case_id"], seal["attempt_id"], seal["execution_key"], seal["result"]) == (
        CASE,
        "a-0001",
        KEY,
        "pass",
    )
    assert store.verify_attempt(attempt.path).valid
    assert publish(store).attempt_id == "a-0002"


def test_missing_payload_is_refused_before_anything_is_written(store) -> None:
    with pytest.raises(ArtifactError) as info:
        store.publish_attempt(CASE, KEY, {"requested.json": {}}, {}, "pass")
    assert info.value.code == "artifacts.incomplete_payload"
    assert not store.path.exists()


def test_publish_bytes_never_overwrites(tmp_path) -> None:
    safe_io.publish_bytes(tmp_path, "a.json", b"first")
    with pytest.raises(ArtifactError) as info:
        safe_io.publish_bytes(tmp_path, "a.json", b"second")
    assert info.value.code == "artifacts.exists"
    assert (tmp_path / "a.json").read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary left behind


def test_attempt_allocation_skips_taken_numbers(tmp_path) -> None:
    (tmp_path / "a-0001").mkdir()
    (tmp_path / "a-0007").mkdir()
    (tmp_path / "notes").mkdir()
    assert safe_io.allocate_attempt_dir(tmp_path)[0] == "a-0008"
    assert safe_io.allocate_attempt_dir(tmp_path)[0] == "a-0009"


def test_attempt_allocation_survives_a_race(tmp_path, monkeypatch) -> None:
    real_mkdir = os.mkdir
    calls: list[str] = []  # the attempt ids the "other runner" took

    def racing_mkdir(path, *args, **kwargs):
        if not calls:  # another runner takes a-0001 between listing and mkdir
            calls.append(path)
            real_mkdir(path, *args, **kwargs)  # same directory (dir_fd) as the runner's
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(safe_io.os, "mkdir", racing_mkdir)
    assert safe_io.allocate_attempt_dir(tmp_path)[0] == "a-0002"


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "", ".x", "a b", "a\x00"])
def test_unsafe_ids_are_refused(tmp_path, bad) -> None:
    with pytest.raises(ArtifactError) as info:
        ExperimentStore(tmp_path, bad)
    assert info.value.code == "artifacts.unsafe_id"
    store = ExperimentStore(tmp_path, "ok")
    with pytest.raises(ArtifactError):
        store.case_dir(bad)
    assert not (tmp_path / "ok" / "cases").exists() or not any((tmp_path / "ok").rglob("*x*"))


def test_symlinked_directories_are_refused(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "out"
    root.mkdir()
    (root / "exp-1").symlink_to(elsewhere)
    store = ExperimentStore(root, "exp-1")
    with pytest.raises(ArtifactError) as info:
        publish(store)
    assert info.value.code == "artifacts.not_a_directory"
    assert list(elsewhere.iterdir()) == []


# -- verification and resume -----------------------------------------------------------------


def test_every_byte_of_complete_is_protected(store, monkeypatch) -> None:
    from xconf.artifacts import seal as seal_module

    digests: dict[str, str] = {}  # payloads do not change here: hash each once

    def cached(path: Path) -> str:
        return digests.setdefault(str(path), safe_io.sha256_file(path))

    monkeypatch.setattr(seal_module, "sha256_file", cached)
    attempt = publish(store)
    seal = attempt.path / SEAL_NAME
    original = seal.read_bytes()
    # Every byte, except that of each 64-hex value only its first and last are flipped.
    skip = {
        i
        for m in re.finditer(rb"[0-9a-fk]{64}", original)
        for i in range(m.start() + 1, m.end() - 1)
    }
    accepted = []
    for offset in (i for i in range(len(original)) if i not in skip):
        flip(seal, offset)
        if store.find_reusable(CASE, KEY) is not None:
            accepted.append((offset, bytes([original[offset] ^ 1])))
        seal.write_bytes(original)
    assert accepted == []
    assert store.find_reusable(CASE, KEY) is not None


@pytest.mark.parametrize("name", PAYLOAD_FILES)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_payload_byte_is_detected(store, name, where) -> None:
    attempt = publish(store)
    path = attempt.path / name
    size = path.stat().st_size
    flip(path, {"first": 0, "middle": size // 2, "last": size - 1}[where])
    check = store.verify_attempt(attempt.path)
    assert check.reason == f"{name} does not match its seal"
    assert store.find_reusable(CASE, KEY) is None


def test_partial_attempt_is_ignored_and_an_older_valid_one_reused(store) -> None:
    publish(store)
    second = publish(store)
    (second.path / SEAL_NAME).unlink()
    assert store.verify_attempt(second.path).reason == "no COMPLETE seal (partial attempt)"
    assert store.find_reusable(CASE, KEY).attempt_id == "a-0001"


def test_newest_valid_attempt_wins(store) -> None:
    publish(store)
    publish(store)
    assert store.find_reusable(CASE, KEY).attempt_id == "a-0002"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "extra.txt").write_text("x"), "unexpected entries ['extra.txt']"),
        (lambda p: (p / "actual.json").unlink(), "actual.json is missing"),
        (
            lambda p: ((p / "identity.json").unlink(), (p / "identity.json").symlink_to(p / "x")),
            "identity.json is not a regular file",
        ),
        (lambda p: (p / SEAL_NAME).write_text("{not json"), "COMPLETE is malformed"),
        (
            lambda p: (p / SEAL_NAME).write_text(json.dumps({"files": {}})),
            "COMPLETE names another attempt",
        ),
    ],
    ids=["extra-file", "missing-file", "symlink-payload", "malformed-seal", "foreign-seal"],
)
def test_damaged_attempts_are_ignored(store, damage, reason) -> None:
    attempt = publish(store)
    damage(attempt.path)
    assert store.verify_attempt(attempt.path).reason == reason
    assert store.find_reusable(CASE, KEY) is None


def test_seal_copied_from_another_attempt_is_refused(store) -> None:
    first = publish(store)
    second = publish(store)
    (second.path / SEAL_NAME).unlink()
    (second.path / SEAL_NAME).write_bytes((first.path / SEAL_NAME).read_bytes())
    assert store.verify_attempt(second.path).reason == "COMPLETE names another attempt"


def test_other_execution_key_or_error_result_is_not_reused(store) -> None:
    publish(store, key="x" * 64)
    assert store.find_reusable(CASE, KEY) is None
    publish(store, result="error")
    assert store.find_reusable(CASE, KEY) is None
    assert store.verify_attempt(store.attempts(CASE)[0]).valid  # sealed for the record


def test_attempts_are_listed_newest_first(store) -> None:
    for _ in range(3):
        publish(store)
    assert [p.name for p in store.attempts(CASE)] == ["a-0003", "a-0002", "a-0001"]
    assert store.case_ids() == [CASE]
    assert store.attempts("c-unknown") == []


# -- plan publication ------------------------------------------------------------------------


def test_the_plan_is_sealed_once_and_a_rerun_must_plan_the_same_cases(store) -> None:
    header = {"schema": "xconf.plan.v1", "experiment_id": "exp-1"}
    store.publish_plan(header, [{"case_id": "c-1"}, {"case_id": "c-2"}])
    sealed = (store.path / "plan.jsonl").read_bytes()
    store.publish_plan(header, [{"case_id": "c-2"}])  # a subset (one job of a sweep)
    assert (store.path / "plan.jsonl").read_bytes() == sealed
    with pytest.raises(ArtifactError) as info:
        store.publish_plan(header, [{"case_id": "c-2"}, {"case_id": "c-3"}])
    assert info.value.code == "artifacts.experiment_conflict"
    assert "another experiment_id" in info.value.message
    before = (store.path / "experiment.json").read_bytes()
    with pytest.raises(ArtifactError) as info:
        store.publish_plan({**header, "scenario": "other"}, [])
    assert info.value.code == "artifacts.experiment_conflict"
    assert (store.path / "experiment.json").read_bytes() == before
    assert json.loads(before)["plan_sha256"]


def test_an_edited_plan_breaks_its_seal(store) -> None:
    header = {"schema": "xconf.plan.v1"}
    store.publish_plan(header, [{"case_id": "c-1"}, {"case_id": "c-2"}])
    lines = (store.path / "plan.jsonl").read_text().splitlines()
    (store.path / "plan.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    with pytest.raises(ArtifactError) as info:
        store.publish_plan(header, [{"case_id": "c-1"}])
    assert info.value.code == "artifacts.plan_seal"


# -- tensors ---------------------------------------------------------------------------------


def test_tensors_are_safetensors_and_nothing_is_unpickled(store, monkeypatch) -> None:
    attempt = publish(store)

    def no_pickle(*args, **kwargs):
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    tensors = read_tensors(attempt.path / "token_diffs.safetensors")
    assert torch.equal(tensors["x"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    fake = attempt.path.parent / "pickled.safetensors"
    with open(fake, "wb") as handle:
        pickle.dump({"x": 1}, handle)
    with pytest.raises(Exception) as info:
        read_tensors(fake)
    assert "unpickled" not in str(info.value)
