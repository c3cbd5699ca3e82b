"""Each sequence as text: the prompt, then every response token with its |diff|.

Only built when a tokenizer is at hand (see :mod:`xconf.report.tokens`). The prompt is
known when the identity is in the runner's teacher-forcing layout (``selected_token_ids``
is ``token_ids`` shifted by one); a judged dump carries only the response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xconf.report.loader import TokenDiffs
from xconf.report.model import SequenceText
from xconf.report.tokens import TokenDecoder

MAX_SEQUENCES = 32
MAX_TOKENS = 512


def _decode(decode: TokenDecoder, ids: Sequence[int]) -> str:
    out = []
    for token in ids:
        try:
            out.append(decode(int(token)))
        except Exception:  # a decoder must never break the report
            out.append(f"<{int(token)}>")
    return "".join(out)


def _rows(identity: Mapping[str, Any], key: str) -> list[list[int]]:
    rows = identity.get(key)
    return rows if isinstance(rows, list) else []


def sequences(
    identity: Mapping[str, Any], diffs: TokenDiffs, decode: TokenDecoder | None
) -> tuple[SequenceText, ...]:
    if decode is None or diffs.token_ids is None or diffs.abs_diff.ndim != 2:
        return ()
    tokens = _rows(identity, "token_ids")
    selected = _rows(identity, "selected_token_ids")
    out = []
    for b in range(min(diffs.abs_diff.shape[0], MAX_SEQUENCES)):
        active = [int(t) for t in diffs.active_mask[b].nonzero()[0]][:MAX_TOKENS]
        if not active:
            continue
        prompt = ""
        if b < len(tokens) and b < len(selected):
            row, sel = tokens[b], selected[b]
            if len(row) == len(sel) and all(
                sel[t] == row[t + 1] for t in active if t + 1 < len(row)
            ):
                prompt = _decode(decode, row[: active[0] + 1])
        out.append(
            SequenceText(
                batch=b,
                prompt=prompt,
                tokens=tuple(
                    (
                        _decode(decode, [int(diffs.token_ids[b, t])]),
                        float(diffs.abs_diff[b, t]),
                        bool(diffs.mismatch_mask[b, t]),
                    )
                    for t in active
                ),
            )
        )
    return tuple(out)
