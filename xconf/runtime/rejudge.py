"""Re-judging a sealed attempt from its stored tensors before resume reuses it.

The seal proves the files are the ones that were sealed; it cannot prove the verdict is
right, since whoever rewrites a payload can rewrite the seal. So before reuse the attempt goes
through the same re-judgement as `xconf verify` (verdict, mismatch count and scores recomputed
from the tensors), and the stored threshold must be the one the contract gives this case's
dtypes now: any disagreement makes the attempt damaged and the case is scored again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from xconf.artifacts.store import read_tensors


def rejudge_attempt(path: Path, seal: Mapping[str, Any], threshold: float) -> str | None:
    """Why the attempt's sealed verdict does not follow from its tensors; None if it does.

    ``threshold`` is the contract's threshold for the case as the runner resolves it.
    """
    from xconf.verify_verdict import check_verdict

    problem = check_verdict(path, seal)
    if problem is not None:
        return problem
    try:
        diffs = read_tensors(path / "token_diffs.safetensors")
    except Exception as exc:  # unreadable is damage, whatever the parser raised
        return f"unreadable token_diffs.safetensors: {type(exc).__name__}: {exc}"
    if not diffs:
        return None  # nothing was compared (identity or artifact verdicts)
    stored = float(diffs["threshold"].to(torch.float32))
    expected = float(torch.tensor(threshold, dtype=torch.float32))
    if stored != expected:
        return f"stored threshold {stored!r} is not the contract's {expected!r} for this case"
    return None
