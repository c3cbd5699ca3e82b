"""Small prompt sets in the layouts users have: JSONL rows and verl's Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VERL_ROWS: list[dict[str, Any]] = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Question: what is two plus three? Answer:"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"index": 0, "split": "train"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "You count."},
            {"role": "user", "content": "Once upon a time a small model"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {"index": 1, "split": "train"},
    },
]
JSONL_ROWS: list[dict[str, Any]] = [
    {"prompt": "The rollout engine samples tokens and"},
    {"messages": [{"role": "user", "content": "def score(model, tokens):"}]},
    {"prompt_ids": [10, 20, 30, 40]},
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_verl_parquet(path: Path, rows: list[dict[str, Any]] = VERL_ROWS) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
