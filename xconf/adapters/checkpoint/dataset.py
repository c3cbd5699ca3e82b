"""Prompts from a dataset file for the freezing rollout (``identity.recipe.dataset``).

A JSONL or Parquet file, one prompt per row. A row has ``prompt_ids`` (token ids, used as
they are), ``messages`` or a chat-message list in ``prompt`` (verl's Parquet layout; rendered
with the tokenizer's chat template and a generation prompt), or ``prompt`` text (tokenized
without special tokens). Other columns (``data_source``, ``reward_model``, ...) are ignored.
Every row is checked before anything runs; a bad one is a coded error naming the file and
row. The freezing rollout's sampling options live beside the path.

The file is read once, from one open descriptor, into memory (at most ``MAX_FILE_BYTES``);
the digest is of exactly those bytes, and the rows tokenized are parsed from them. The
frozen-token cache is keyed on the digest taken when the experiment was planned: bytes
that no longer match it (the file was replaced in between) are refused
(``dataset.changed``), never tokenized under the old digest. JSON Lines are split on
``\n`` only (U+2028 or U+0085 inside a string is valid JSON), and a line longer than
``MAX_LINE_BYTES`` or a prompt text longer than ``MAX_PROMPT_CHARS`` is refused before
anything is tokenized.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xconf.errors import ConfigError

DATASET_KEYS = frozenset(
    {
        "path",
        "max_prompts",
        "shuffle_seed",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "n",
        "seed",
    }
)
MAX_ROWS = 100_000
MAX_FILE_BYTES = 256 << 20
MAX_LINE_BYTES = 4 << 20
MAX_PROMPT_CHARS = 1 << 20
MAX_PARQUET_BYTES = 1 << 30  # uncompressed
WHERE = "identity.recipe.dataset"


@dataclass(frozen=True)
class DatasetOptions:
    path: str
    sha256: str
    max_prompts: int | None
    shuffle_seed: int | None
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    n: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _error(code: str, message: str, where: str) -> ConfigError:
    return ConfigError(code, message, where)


def _number(node: Mapping[str, Any], key: str, kind: type, default: Any, low: float) -> Any:
    value = node.get(key)
    if value is None:
        return default
    ok = isinstance(value, int | float) if kind is float else isinstance(value, int)
    if isinstance(value, bool) or not ok or value < low:
        raise _error("config.invalid_value", f"{key} must be a {kind.__name__} >= {low}", key)
    return kind(value)


def parse_dataset(node: Any, defaults: Mapping[str, Any]) -> DatasetOptions | None:
    """The dataset options, or None when no path is set; the file is digested here."""
    if node is None:
        return None
    if not isinstance(node, Mapping):
        raise _error("config.wrong_type", "expected a mapping", WHERE)
    for key in node:
        if key not in DATASET_KEYS:
            raise _error("config.unknown_key", f"unknown dataset option '{key}'", f"{WHERE}.{key}")
    if node.get("path") is None:
        return None
    path = Path(str(node["path"])).expanduser().resolve()
    if not path.is_file():
        raise _error("dataset.missing_file", f"dataset file {path} does not exist", f"{WHERE}.path")
    if path.suffix not in (".jsonl", ".parquet"):
        raise _error("dataset.format", "a dataset is a .jsonl or .parquet file", str(path))
    sha256 = hashlib.sha256(read_dataset_bytes(path)).hexdigest()
    try:
        options = DatasetOptions(
            path=str(path),
            sha256=sha256,
            max_prompts=_number(node, "max_prompts", int, None, 1),
            shuffle_seed=_number(node, "shuffle_seed", int, None, 0),
            temperature=_number(node, "temperature", float, defaults["temperature"], 0),
            top_p=_number(node, "top_p", float, 1.0, 0),
            top_k=_number(node, "top_k", int, -1, -1),
            max_tokens=_number(node, "max_tokens", int, defaults["response_len"], 1),
            n=_number(node, "n", int, 1, 1),
            seed=_number(node, "seed", int, defaults["seed"], 0),
        )
    except ConfigError as exc:
        raise _error(exc.code, exc.message, f"{WHERE}.{exc.path}") from exc
    if not 0 < options.top_p <= 1:
        raise _error("config.invalid_value", "top_p must be in (0, 1]", f"{WHERE}.top_p")
    if options.top_k == 0:
        raise _error("config.invalid_value", "top_k is -1 (off) or >= 1", f"{WHERE}.top_k")
    return options


def read_dataset_bytes(path: Path) -> bytes:
    """The file's bytes, read from one open descriptor (a regular file, bounded)."""
    from xconf.artifacts.layout import open_regular
    from xconf.errors import ArtifactError

    try:
        with open_regular(path, MAX_FILE_BYTES, follow=True) as fd:
            return _read_all(fd, path)
    except FileNotFoundError:
        raise _error(
            "dataset.missing_file", f"dataset file {path} does not exist", str(path)
        ) from None
    except ArtifactError as exc:
        code = "dataset.too_large" if exc.code == "artifacts.too_large" else "dataset.unreadable"
        raise _error(code, exc.message, str(path)) from None


def _read_all(fd: int, path: Path) -> bytes:
    chunks, total = [], 0
    while chunk := os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > MAX_FILE_BYTES:
            raise _error(
                "dataset.too_large", f"the file grew past {MAX_FILE_BYTES} bytes", str(path)
            )
    return b"".join(chunks)


def read_rows(path: Path, data: bytes | None = None) -> list[Any]:
    """The rows of ``data`` (the file's bytes; read here when not given) as plain Python
    values (Parquet through pyarrow, no pickle)."""
    if data is None:
        data = read_dataset_bytes(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - pyarrow is a core dependency
            raise _error(
                "dataset.no_pyarrow", f"reading Parquet needs pyarrow: {exc}", str(path)
            ) from exc
        from xconf.artifacts.columnar import parquet_table
        from xconf.errors import ArtifactError

        try:
            # A compressed file can expand far past its size: the one bounded Parquet reader
            # checks what its metadata declares, then each decoded batch.
            names = pq.ParquetFile(pa.BufferReader(data)).schema_arrow.names
            table = parquet_table(data, names, str(path), MAX_PARQUET_BYTES, MAX_ROWS)
            rows: list[Any] = table.to_pylist()
        except ArtifactError as exc:
            code = "dataset.too_large" if exc.code == "columnar.too_large" else "dataset.unreadable"
            raise _error(code, exc.message, str(path)) from None
        except Exception as exc:  # pyarrow raises several unrelated types for a bad file
            raise _error(
                "dataset.unreadable", f"not a readable Parquet file: {exc}", str(path)
            ) from exc
    else:
        rows = []
        # JSON Lines end at "\n" only: str.splitlines would also split inside a string at
        # U+2028, U+0085 and other Unicode line breaks, which JSON allows there unescaped.
        for i, raw in enumerate(data.split(b"\n")):
            where = f"{path}:row {len(rows)}"
            if len(raw) > MAX_LINE_BYTES:
                raise _error(
                    "dataset.line_too_long",
                    f"line {i + 1} is {len(raw)} bytes, more than the {MAX_LINE_BYTES} a line "
                    "may have",
                    where,
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _error("dataset.unreadable", f"line {i + 1}: {exc}", where) from None
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise _error(
                    "dataset.bad_row", f"row {len(rows)} (line {i + 1}) is not JSON: {exc}", where
                ) from exc
            except RecursionError:
                raise _error(
                    "dataset.bad_row", f"row {len(rows)} (line {i + 1}) is nested too deep", where
                ) from None
            if len(rows) > MAX_ROWS:
                break
    if not rows:
        raise _error("dataset.empty", "the dataset has no rows", str(path))
    if len(rows) > MAX_ROWS:
        raise _error("dataset.too_large", f"more than {MAX_ROWS} rows", str(path))
    return rows


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _error("dataset.bad_messages", "chat messages must be a non-empty list", where)
    out = []
    for k, message in enumerate(value):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise _error(
                "dataset.bad_messages",
                f"message {k} needs string 'role' and 'content'",
                where,
            )
        out.append({"role": message["role"], "content": message["content"]})
    return out


def row_prompt_ids(row: Any, tokenizer: Any, vocab_size: int, where: str) -> tuple[int, ...]:
    """One row's prompt as token ids (see the module docstring for the accepted fields)."""
    if not isinstance(row, Mapping):
        raise _error("dataset.bad_row", "a row must be an object", where)
    if row.get("prompt_ids") is not None:
        ids = row["prompt_ids"]
        if (
            not isinstance(ids, list)
            or not ids
            or any(isinstance(t, bool) or not isinstance(t, int) for t in ids)
        ):
            raise _error("dataset.bad_prompt_ids", "prompt_ids must be non-empty integers", where)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise _error(
                "dataset.bad_prompt_ids", f"token ids {bad[:3]} outside [0, {vocab_size})", where
            )
        return tuple(int(t) for t in ids)
    chat = row.get("messages")
    if chat is None and isinstance(row.get("prompt"), list):
        chat = row["prompt"]
    if chat is not None:
        messages = _messages(chat, where)
        from xconf.adapters.models.chat_template import chat_template, render_chat

        if chat_template(tokenizer) is None:
            raise _error(
                "dataset.no_chat_template",
                "the row has chat messages but the tokenizer has no chat template",
                where,
            )
        # The template is the checkpoint's code: rendered sandboxed and bounded.
        text = render_chat(tokenizer, messages, where=where)
    elif isinstance(row.get("prompt"), str) and row["prompt"]:
        text = row["prompt"]
    else:
        raise _error(
            "dataset.no_prompt", "the row has no 'prompt', 'messages' or 'prompt_ids'", where
        )
    if len(text) > MAX_PROMPT_CHARS:
        raise _error(
            "dataset.too_long",
            f"the prompt is {len(text)} characters, more than the {MAX_PROMPT_CHARS} tokenized",
            where,
        )
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise _error("dataset.empty_prompt", "the prompt tokenizes to nothing", where)
    return tuple(int(t) for t in ids)


def load_prompt_ids(
    options: DatasetOptions, tokenizer: Any, vocab_size: int, max_model_len: int
) -> list[tuple[int, ...]]:
    """Every row checked, then shuffled (if asked) and cut to ``max_prompts``."""
    path = Path(options.path)
    data = read_dataset_bytes(path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != options.sha256:
        # Tokens of these bytes would be cached under the other digest: refuse them.
        raise _error(
            "dataset.changed",
            f"the file changed since the experiment was planned (sha256 {options.sha256[:16]}… "
            f"then, {digest[:16]}… now); plan it again",
            str(path),
        )
    prompts = []
    for i, row in enumerate(read_rows(path, data)):
        where = f"{path}:row {i}"
        ids = row_prompt_ids(row, tokenizer, vocab_size, where)
        if len(ids) + options.max_tokens > max_model_len:
            raise _error(
                "dataset.too_long",
                f"{len(ids)} prompt + {options.max_tokens} response tokens exceed "
                f"max_model_len {max_model_len}",
                where,
            )
        prompts.append(ids)
    order = list(range(len(prompts)))
    if options.shuffle_seed is not None:
        random.Random(options.shuffle_seed).shuffle(order)
    if options.max_prompts is not None:
        order = order[: options.max_prompts]
    return [prompts[i] for i in order]


def generate_from_ids(
    engine: Any, prompts: Sequence[tuple[int, ...]], options: DatasetOptions
) -> Any:
    """The freezing rollout: ``n`` seeded samples of ``max_tokens`` tokens per prompt."""
    from vllm import SamplingParams

    from xconf.adapters.errors import ScoringError
    from xconf.adapters.frozen import FrozenBatch, FrozenSample

    params = [
        SamplingParams(
            n=options.n,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            seed=options.seed + i,
            ignore_eos=True,  # fixed-length responses: every case scores the same token count
            detokenize=False,
        )
        for i in range(len(prompts))
    ]
    outs = engine.llm.generate(
        [{"prompt_token_ids": list(ids)} for ids in prompts], params, use_tqdm=False
    )
    samples = []
    for ids, out in zip(prompts, outs, strict=True):
        for completion in out.outputs:
            resp = tuple(int(t) for t in completion.token_ids)
            if len(resp) != options.max_tokens:
                raise ScoringError(
                    "runtime.short_response",
                    f"generated {len(resp)} of {options.max_tokens} tokens",
                    f"{WHERE}.max_tokens",
                )
            samples.append(FrozenSample(tuple(ids), resp))
    tok = engine.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return FrozenBatch(tuple(samples), int(pad))


def load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise _error("runtime_unavailable", f"transformers is not installed: {exc}", path) from exc
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
