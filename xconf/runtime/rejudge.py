"""Re-judging a sealed attempt from its stored tensors before resume reuses it.

The seal proves the files are the ones that were sealed; it cannot prove the verdict is
right, since whoever rewrites a payload can rewrite the seal. So before reuse the verdict is
recomputed from the stored scores, by the contract's threshold (not the stored one), and
compared with the sealed comparison.json: any disagreement makes the attempt damaged.
"""

from __future__ import annotations

from pathlib import Path

import torch

from xconf.artifacts.store import read_json, read_tensors
from xconf.comparison import recompute_result

JUDGED = frozenset({"pass", "fail", "zero_active_tokens"})


def rejudge_attempt(path: Path, threshold: float) -> str | None:
    """Why the attempt's sealed verdict does not follow from its tensors; None if it does.

    ``threshold`` is the contract's threshold for the case, rounded to float32.
    """
    try:
        document = read_json(path / "comparison.json")
        result = document["result"]
        if result not in JUDGED:
            return None  # nothing numeric to re-judge: identity/artifact verdicts are not reused
        diffs = read_tensors(path / "token_diffs.safetensors")
        sides = {
            side: read_tensors(path / f"score_{side}.safetensors")
            for side in ("rollout", "training")
        }
        stored = float(diffs["threshold"].to(torch.float32))
        if stored != float(torch.tensor(threshold, dtype=torch.float32)):
            return f"stored threshold {stored!r} is not the contract's {threshold!r}"
        active = diffs["active_mask"].bool()
        for side in ("rollout", "training"):
            scored = sides[side]["logprobs"].to(torch.float32)
            if scored.shape != active.shape or not torch.equal(
                torch.where(active, scored, torch.zeros_like(scored)),
                diffs[f"{side}_logprobs"].to(torch.float32),
            ):
                return f"token_diffs {side} logprobs differ from score_{side}.safetensors"
            if not torch.equal(sides[side]["active_mask"].bool(), active):
                return f"score_{side}.safetensors scored another active mask"
        again, mismatches = recompute_result(diffs)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        return f"cannot re-judge: {type(exc).__name__}: {exc}"
    if again != result or mismatches != int(document.get("mismatches") or 0):
        return (
            f"sealed verdict {result} with {document.get('mismatches')} mismatches; the stored "
            f"tensors give {again} with {mismatches}"
        )
    return None
