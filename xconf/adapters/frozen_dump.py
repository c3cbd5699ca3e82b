"""A dumped training step frozen as the identity: its own prompt and response token ids.

verl's batch layout (``DataProto.batch``) for B sequences, prompt width P, response width R:
``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``input_ids`` [B, P + R]
their concatenation, ``attention_mask`` [B, P + R], ``response_mask`` [B, R] (the tokens
the loss uses; default: the response's attention) and ``position_ids`` [B, P + R]. Each row
becomes one :class:`FrozenSample`: the attended prompt tokens, then the attended response
tokens up to the last masked one (a causal model's later tokens change no earlier logprob).

The dump is read with judge's readers (:mod:`xconf.judge.dumps`), never a second one. Every
check runs before a run writes anything; each failure is a coded :class:`ConfigError` (exit
2) naming the file and the key: token ids outside the checkpoint's vocabulary, masks or
positions that do not fit the ids, a response that does not end its prompt+response row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xconf.adapters.frozen import FrozenBatch, FrozenSample, build_identity
from xconf.config.dump_identity import DEFAULT_KEYS, DUMP_KIND
from xconf.errors import ConfigError
from xconf.experiment import Identity

if TYPE_CHECKING:
    import torch

    from xconf.adapters.models import ModelRecord


@dataclass(frozen=True)
class DumpRecipe:
    path: str
    sha256: str
    keys: Mapping[str, str]
    model: Mapping[str, Any]


def dump_recipe(identity: Identity) -> DumpRecipe | None:
    """The identity's from-dump recipe, or None for any other identity."""
    recipe = json.loads(identity.recipe)
    if not isinstance(recipe, dict) or recipe.get("kind") != DUMP_KIND:
        return None
    return DumpRecipe(
        path=str(recipe["dump"]),
        sha256=str(recipe["sha256"]),
        keys={**DEFAULT_KEYS, **dict(recipe.get("keys") or {})},
        model=dict(recipe.get("model") or {}),
    )


def _fail(code: str, message: str, where: str) -> ConfigError:
    return ConfigError(f"identity.{code}", message, where)


def _matrix(
    tensors: Mapping[str, torch.Tensor], key: str, where: str, *, mask: bool = False
) -> torch.Tensor | None:
    """``key`` as int64 [B, T]; ``mask``: 0/1 values of any dtype (judge accepts float masks)."""
    value = tensors.get(key)
    if value is None:
        return None
    if value.dim() == 1:
        value = value.unsqueeze(0)
    if value.dim() != 2:
        raise _fail(
            "dump_bad_shape",
            f"'{key}' must be [B, T], got {tuple(value.shape)} (3-D position ids, as for "
            "multimodal rope, are not replayable)",
            f"{where}:{key}",
        )
    if value.dtype.is_complex or (value.is_floating_point() and not mask):
        raise _fail("dump_not_integer", f"'{key}' holds {value.dtype}, not integers", where)
    if mask:
        _binary(value, key, where)
    import torch

    return value.to(torch.int64)


def _binary(mask: torch.Tensor, key: str, where: str) -> None:
    if bool(((mask != 0) & (mask != 1)).any()):
        raise _fail("dump_bad_mask", f"'{key}' entries must be 0 or 1", f"{where}:{key}")


def _shape(value: torch.Tensor, shape: tuple[int, int], key: str, where: str) -> None:
    if tuple(value.shape) != shape:
        raise _fail(
            "dump_mask_mismatch",
            f"'{key}' is {tuple(value.shape)}, the ids are {shape}",
            f"{where}:{key}",
        )


def _ids(tensors: Mapping[str, torch.Tensor], keys: Mapping[str, str], where: str) -> Any:
    import torch

    responses = _matrix(tensors, keys["responses"], where)
    input_ids = _matrix(tensors, keys["input_ids"], where)
    prompts = _matrix(tensors, keys["prompts"], where)
    if responses is None:
        raise _fail(
            "dump_missing_key",
            f"no '{keys['responses']}' (response token ids) in the dump "
            f"(has: {', '.join(sorted(tensors)) or 'nothing'})",
            f"{where}:{keys['responses']}",
        )
    width = responses.shape[1]
    if width == 0 or responses.shape[0] == 0:
        raise _fail(
            "dump_empty",
            f"'{keys['responses']}' is {tuple(responses.shape)}: no response token to replay",
            f"{where}:{keys['responses']}",
        )
    if input_ids is None and prompts is not None:
        if prompts.shape[0] != responses.shape[0]:
            raise _fail(
                "dump_shape_mismatch",
                f"'{keys['prompts']}' has {prompts.shape[0]} rows, "
                f"'{keys['responses']}' {responses.shape[0]}",
                f"{where}:{keys['prompts']}",
            )
        input_ids = torch.cat([prompts, responses], dim=1)
    if input_ids is None:
        raise _fail(
            "dump_missing_key",
            f"no '{keys['input_ids']}' or '{keys['prompts']}': the prompts are needed to replay",
            f"{where}:{keys['input_ids']}",
        )
    if input_ids.shape[0] != responses.shape[0] or input_ids.shape[1] <= width:
        raise _fail(
            "dump_response_not_at_end",
            f"'{keys['input_ids']}' is {tuple(input_ids.shape)}; it must hold a prompt and then "
            f"the {width} response tokens of each of the {responses.shape[0]} rows",
            f"{where}:{keys['input_ids']}",
        )
    if not torch.equal(input_ids[:, -width:], responses):
        row = int((input_ids[:, -width:] != responses).any(dim=1).nonzero()[0])
        raise _fail(
            "dump_response_not_at_end",
            f"row {row}: '{keys['responses']}' does not end the prompt+response row "
            f"'{keys['input_ids']}'",
            f"{where}:{keys['input_ids']}",
        )
    if prompts is not None and not torch.equal(input_ids[:, :-width], prompts):
        raise _fail(
            "dump_prompt_mismatch",
            f"'{keys['input_ids']}' does not start with '{keys['prompts']}'",
            f"{where}:{keys['prompts']}",
        )
    return input_ids, width


def _run_of_ones(row: list[int], *, left: bool) -> bool:
    """``row`` is 0...0 1...1 (``left``: left padding) or 1...1 0...0."""
    ones = sum(row)
    want = [0] * (len(row) - ones) + [1] * ones if left else [1] * ones + [0] * (len(row) - ones)
    return row == want


def read_batch(
    recipe: DumpRecipe, vocab_size: int, max_model_len: int, eos_token_id: int
) -> FrozenBatch:
    """The dump's rows as frozen samples, every check done; nothing is written."""
    from xconf.judge.formats import JudgeError, parse_dump

    path = Path(recipe.path)
    where = str(path)
    keys = recipe.keys
    try:  # judge's reader: one read, the digest of exactly the bytes parsed
        parsed = parse_dump(path, set(keys.values()))
    except JudgeError as exc:  # it names the file and the problem
        raise _fail("dump_unreadable", exc.message, exc.path or where) from exc
    if parsed.sha256 != recipe.sha256:
        raise _fail(
            "dump_changed",
            f"the dump changed since the experiment was planned (sha256:"
            f"{recipe.sha256[:12]}…); plan it again",
            where,
        )
    tensors = {name: column.values for name, column in parsed.columns.items()}
    input_ids, width = _ids(tensors, keys, where)
    shape = (int(input_ids.shape[0]), int(input_ids.shape[1]))
    prompt_width = shape[1] - width
    attention = _matrix(tensors, keys["attention_mask"], where, mask=True)
    if attention is None:
        raise _fail(
            "dump_missing_key",
            f"no '{keys['attention_mask']}': without it the padding cannot be told from tokens",
            f"{where}:{keys['attention_mask']}",
        )
    _shape(attention, shape, keys["attention_mask"], where)
    response_mask = _matrix(tensors, keys["response_mask"], where, mask=True)
    if response_mask is None:
        response_mask = attention[:, prompt_width:]
    _shape(response_mask, (shape[0], width), keys["response_mask"], where)
    positions = _matrix(tensors, keys["position_ids"], where)
    if positions is not None:
        _shape(positions, shape, keys["position_ids"], where)
    ids_rows = input_ids.tolist()
    attn_rows = attention.tolist()
    mask_rows = response_mask.tolist()
    pos_rows = positions.tolist() if positions is not None else None
    samples = []
    pads: set[int] = set()
    for b in range(shape[0]):
        samples.append(
            _sample(
                b,
                ids_rows[b],
                attn_rows[b],
                mask_rows[b],
                None if pos_rows is None else pos_rows[b],
                prompt_width,
                vocab_size,
                max_model_len,
                keys,
                where,
            )
        )
        pads.update(t for t, a in zip(ids_rows[b], attn_rows[b], strict=True) if not a)
    # The dump's own pad id when it used one (the frozen rows then equal the dumped rows);
    # pad positions are never attended, so any in-vocabulary id scores the same.
    pad = next(iter(pads)) if len(pads) == 1 else eos_token_id
    return FrozenBatch(tuple(samples), pad if 0 <= pad < vocab_size else eos_token_id)


def _sample(
    b: int,
    ids: list[int],
    attn: list[int],
    mask: list[int],
    positions: list[int] | None,
    prompt_width: int,
    vocab_size: int,
    max_model_len: int,
    keys: Mapping[str, str],
    where: str,
) -> FrozenSample:
    row = f"{where}:{keys['attention_mask']}[{b}]"
    if not _run_of_ones(attn[:prompt_width], left=True):
        raise _fail("dump_bad_padding", f"row {b}: the prompt must be left-padded", row)
    if not _run_of_ones(attn[prompt_width:], left=False):
        raise _fail("dump_bad_padding", f"row {b}: the response must be right-padded", row)
    attended = sum(attn[prompt_width:])
    active = [t for t, m in enumerate(mask) if m]
    mask_where = f"{where}:{keys['response_mask']}[{b}]"
    if any(t >= attended for t in active):
        raise _fail(
            "dump_mask_mismatch",
            f"row {b}: '{keys['response_mask']}' marks response position {active[-1]}, but "
            f"only {attended} response tokens are attended",
            mask_where,
        )
    if not active:
        raise _fail("dump_empty_row", f"row {b}: no response token is masked in", mask_where)
    if active != list(range(len(active))):
        raise _fail(
            "dump_mask_gaps",
            f"row {b}: '{keys['response_mask']}' has gaps (e.g. tool tokens of a multi-turn "
            "rollout); only a contiguous response from its first token is replayable",
            mask_where,
        )
    prompt = [t for t, a in zip(ids[:prompt_width], attn[:prompt_width], strict=True) if a]
    if not prompt:
        raise _fail("dump_empty_row", f"row {b}: the prompt is empty", row)
    response = ids[prompt_width : prompt_width + len(active)]
    bad = [t for t in (*prompt, *response) if not 0 <= t < vocab_size]
    if bad:
        raise _fail(
            "dump_token_out_of_vocab",
            f"row {b}: token ids {bad[:3]} outside the checkpoint's vocabulary [0, {vocab_size})",
            f"{where}:{keys['input_ids']}[{b}]",
        )
    length = len(prompt) + len(response)
    if length > max_model_len:
        raise _fail(
            "dump_too_long",
            f"row {b}: {length} tokens exceed max_model_len {max_model_len} "
            "(raise runtime.max_model_len)",
            row,
        )
    if positions is not None:
        seen = [p for p, a in zip(positions, attn, strict=True) if a][:length]
        if seen != list(range(length)):
            raise _fail(
                "dump_bad_positions",
                f"row {b}: position ids of the attended tokens must be 0..{length - 1} "
                "(packed or offset positions are not replayable)",
                f"{where}:{keys['position_ids']}[{b}]",
            )
    return FrozenSample(tuple(prompt), tuple(response))


def freeze_dump(
    identity: Identity, recipe: DumpRecipe, record: ModelRecord, max_model_len: int
) -> Identity:
    """The identity with the dump's tokens frozen, naming the checkpoint and the dump."""
    batch = read_batch(recipe, record.vocab_size, max_model_len, record.eos_token_id)
    frozen_recipe: dict[str, Any] = {
        "kind": DUMP_KIND,
        "dump": recipe.path,
        "sha256": recipe.sha256,
        "keys": dict(recipe.keys),
        "model": {"checkpoint": "local"} if record.local else dict(recipe.model),
    }
    if record.local:  # where the tokenizer is lets the report show text
        frozen_recipe["tokenizer_path"] = record.tokenizer_path or record.path
    return build_identity(
        batch,
        checkpoint_id=f"sha256:{record.checkpoint_sha256}",
        model_version=record.model_version,
        tokenizer_id=record.tokenizer_id,
        pre_update_state=f"checkpoint sha256:{record.checkpoint_sha256} as given; tokens "
        f"replayed from dump sha256:{recipe.sha256}",
        scoring_mode=identity.scoring_mode,
        recipe=frozen_recipe,
        cache_metadata=json.loads(identity.cache_metadata) or None,
    )


def _key_names(path: Path) -> frozenset[str]:
    """The names a dump holds, as judge's reader lists them (nothing when it cannot)."""
    from xconf.judge.formats import JudgeError, parse_dump

    try:
        return parse_dump(path, set()).names
    except JudgeError:  # a hint must never break a verdict that is already sealed
        return frozenset()


def replay_command(path: str, experiment: str = "s2_cpu", runtime: str = "vllm_hf") -> str | None:
    """The ``xconf-run`` line that replays a judged dump's tokens through the knob sweep;
    None when the dump lacks what a replay needs (response ids, prompt ids, attention)."""
    import shlex

    names = _key_names(Path(path))
    keys = DEFAULT_KEYS
    if not (
        keys["responses"] in names
        and keys["attention_mask"] in names
        and (keys["input_ids"] in names or keys["prompts"] in names)
    ):
        return None
    return (
        f"xconf-run +experiment={experiment} runtime={runtime} identity=from_dump "
        f"identity.dump={shlex.quote(path)} runtime.model.path=YOUR_CHECKPOINT"
    )
