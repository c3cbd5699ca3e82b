"""Campaign 3, prompt files: the bytes tokenized are the bytes digested, JSON Lines split
on ``\\n`` only, and a huge line or file is refused before anything is tokenized.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from xconf.adapters.checkpoint import dataset
from xconf.errors import XconfError

DEFAULTS = {"temperature": 1.0, "response_len": 4, "seed": 7}
ROWS_A = [{"prompt_ids": [1, 2, 3]}, {"prompt_ids": [4, 5]}]
ROWS_B = [{"prompt_ids": [9, 9, 9, 9]}]


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


def _load(path: Path) -> list[tuple[int, ...]]:
    options = dataset.parse_dataset({"path": str(path)}, DEFAULTS)
    assert options is not None
    return dataset.load_prompt_ids(options, None, 512, 256)


def test_file_replaced_after_planning_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "prompts.jsonl", ROWS_A)
    options = dataset.parse_dataset({"path": str(path)}, DEFAULTS)
    assert options is not None
    replacement = _write(tmp_path / "b.jsonl", ROWS_B)
    os.replace(replacement, path)  # between the digest (plan) and the freezing read
    with pytest.raises(XconfError) as refused:
        dataset.load_prompt_ids(options, None, 512, 256)
    assert refused.value.code == "dataset.changed" and refused.value.path == str(path)


def test_file_replaced_between_open_and_read_tokenizes_what_was_digested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "prompts.jsonl", ROWS_A)
    options = dataset.parse_dataset({"path": str(path)}, DEFAULTS)
    assert options is not None
    read_all = dataset._read_all
    swaps: list[Path] = []

    def swap_then_read(fd: int, where: Path) -> bytes:
        # The file is open: replace the name, then read the descriptor.
        os.replace(_write(tmp_path / f"b{len(swaps)}.jsonl", ROWS_B), path)
        swaps.append(where)
        return read_all(fd, where)

    monkeypatch.setattr(dataset, "_read_all", swap_then_read)
    assert dataset.load_prompt_ids(options, None, 512, 256) == [(1, 2, 3), (4, 5)]
    assert swaps == [path]  # one open, one read: the rows are A's, whose digest keys them
    monkeypatch.setattr(dataset, "_read_all", read_all)
    assert _load(path) == [(9, 9, 9, 9)]  # B itself is B's, under B's digest


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_breaks_inside_strings_are_json(tmp_path: Path, separator: str) -> None:
    rows = [{"prompt_ids": [1, 2], "data_source": f"a{separator}b"}, {"prompt_ids": [3]}]
    path = _write(tmp_path / "prompts.jsonl", rows)
    assert separator in path.read_text("utf-8")  # raw, not escaped
    assert _load(path) == [(1, 2), (3,)]


def test_fifty_megabyte_line_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("w") as out:
        out.write(json.dumps({"prompt_ids": [1]}) + "\n")
        out.write('{"prompt": "' + "word " * (10 * 1024 * 1024) + '"}\n')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(XconfError) as refused:
        _load(path)
    seconds = time.monotonic() - started
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert refused.value.code == "dataset.line_too_long" and "line 2" in refused.value.message
    assert str(path) in str(refused.value.path)
    assert seconds < 10 and grown_mib < 400, (seconds, grown_mib)


def test_file_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "sparse.jsonl"
    with path.open("wb") as out:
        out.truncate(dataset.MAX_FILE_BYTES + 1)
    with pytest.raises(XconfError) as refused:
        dataset.parse_dataset({"path": str(path)}, DEFAULTS)
    assert refused.value.code == "dataset.too_large"


def test_parquet_that_expands_past_its_bound_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bomb.parquet"
    # 8 MiB of one repeated character compresses to a few KiB.
    pq.write_table(pa.table({"prompt": ["a" * (8 << 20)]}), str(path), compression="zstd")
    assert path.stat().st_size < 1 << 20
    monkeypatch.setattr(dataset, "MAX_PARQUET_BYTES", 4 << 20)
    with pytest.raises(XconfError) as refused:
        _load(path)
    assert refused.value.code == "dataset.too_large" and "uncompressed" in refused.value.message
