"""identity.recipe.dataset: JSONL and verl Parquet rows to prompt ids; bad rows coded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.inputs.datasets import JSONL_ROWS, VERL_ROWS, write_jsonl, write_verl_parquet
from xconf.adapters.checkpoint.dataset import load_prompt_ids, parse_dataset
from xconf.errors import XconfError

DEFAULTS = {"temperature": 1.0, "response_len": 12, "seed": 7}


def _tok(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_verl_parquet_and_jsonl_rows(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    tok = _tok(checkpoints["qwen3"])
    opts = parse_dataset({"path": str(write_verl_parquet(tmp_path / "p.parquet"))}, DEFAULTS)
    assert opts is not None and (opts.max_tokens, opts.seed, opts.n) == (12, 7, 1)
    ids = load_prompt_ids(opts, tok, 512, 256)
    rendered = tok.apply_chat_template(
        VERL_ROWS[1]["prompt"], tokenize=False, add_generation_prompt=True
    )
    assert ids[1] == tuple(tok(rendered, add_special_tokens=False)["input_ids"])
    assert tok.decode(ids[0]).endswith("<|im_start|>assistant\n")
    jsonl = write_jsonl(tmp_path / "p.jsonl", JSONL_ROWS)
    node = {"path": str(jsonl), "max_prompts": 2, "shuffle_seed": 3, "top_k": 5, "n": 2}
    opts = parse_dataset(node, DEFAULTS)
    assert opts is not None
    all_ids = load_prompt_ids(replace(opts, max_prompts=None, shuffle_seed=None), tok, 512, 256)
    assert all_ids[2] == (10, 20, 30, 40)
    assert all_ids[0] == tuple(tok(JSONL_ROWS[0]["prompt"], add_special_tokens=False)["input_ids"])
    picked = load_prompt_ids(opts, tok, 512, 256)
    assert len(picked) == 2 and set(picked) <= set(all_ids)
    assert picked == load_prompt_ids(opts, tok, 512, 256)  # the shuffle is seeded


BAD_ROWS = [
    ([{"prompt": "ok"}, {"data_source": "x"}], "dataset.no_prompt", "row 1"),
    ([{"prompt_ids": [1, 99999]}], "dataset.bad_prompt_ids", "row 0"),
    ([{"messages": [{"role": "user"}]}], "dataset.bad_messages", "row 0"),
    ([{"prompt": "x" * 2000}], "dataset.too_long", "row 0"),
]


@pytest.mark.parametrize(("rows", "code", "row"), BAD_ROWS)
def test_bad_rows_name_file_and_row(
    checkpoints: dict[str, Path], tmp_path: Path, rows: list[Any], code: str, row: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    opts = parse_dataset({"path": str(path)}, DEFAULTS)
    assert opts is not None
    with pytest.raises(XconfError) as err:
        load_prompt_ids(opts, _tok(checkpoints["qwen3"]), 512, 256)
    assert err.value.code == code
    assert err.value.path == f"{path.resolve()}:{row}"


def test_bad_dataset_options_are_coded(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", JSONL_ROWS)
    for node, code, where in [
        ({"path": str(tmp_path / "absent.jsonl")}, "dataset.missing_file", "path"),
        ({"path": str(path), "top_p": 0}, "config.invalid_value", "top_p"),
        ({"path": str(path), "n": 0}, "config.invalid_value", "n"),
        ({"path": str(path), "temprature": 1}, "config.unknown_key", "temprature"),
    ]:
        with pytest.raises(XconfError) as err:
            parse_dataset(node, DEFAULTS)
        assert (err.value.code, err.value.path) == (code, f"identity.recipe.dataset.{where}")
