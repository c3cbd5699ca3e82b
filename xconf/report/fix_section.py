"""The report's "Fix search" section: each sealed fix-search record (``xconf fix``), checked
against the run's own sealed cases.

The record (``xconf.artifacts.fix_record``) names the cases it ran; what they say is read from
the cases themselves, as the rest of the report reads them. A record that calls a case a
verified fix is shown as one only when that case's chosen attempt is the one named, its seal
verifies and its verdict is ``pass``; anything else is shown as what it is, never as a fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xconf.artifacts.fix_record import all_latest
from xconf.report.model import CaseReport

STEP_KEYS = ("case_id", "label", "result", "mismatches", "active_tokens", "bitwise", "effect_text")


def _checked(record: dict[str, Any], cases: dict[str, CaseReport]) -> tuple[str, bool]:
    """The record's closing line, and whether its verified fix stands on the run's cases."""
    line = str(record.get("line", ""))
    verified = record.get("verified")
    if not isinstance(verified, dict):
        return line, False
    case = cases.get(str(verified.get("case_id")))
    if (
        case is None
        or not case.seal_verified
        or case.attempt_id != verified.get("attempt_id")
        or case.result != "pass"
    ):
        shown = "missing" if case is None else f"{case.result} ({case.attempt_id})"
        return (
            f"not a verified fix: the record names case {verified.get('case_id')} as one, but "
            f"its sealed verdict here is {shown}",
            False,
        )
    return line, True


def fix_sections(run_dir: str | Path, cases: Iterable[CaseReport]) -> tuple[dict[str, Any], ...]:
    """One entry per case the fix search ran on: where it started, each step, the line."""
    by_id = {c.case_id: c for c in cases}
    out = []
    for record in all_latest(Path(run_dir)):
        line, verified = _checked(record, by_id)
        steps = [
            {k: s.get(k) for k in STEP_KEYS}
            for s in record.get("steps") or ()
            if isinstance(s, dict)
        ]
        found = record.get("start")
        start: dict[str, Any] = found if isinstance(found, dict) else {}
        out.append(
            {
                "case_id": record.get("case_id"),
                "label": record.get("label"),
                "first_divergence": start.get("tap"),
                "start_kind": start.get("kind"),
                "steps": steps,
                "notes": [str(n) for n in record.get("notes") or ()],
                "line": line,
                "verified": verified,
            }
        )
    return tuple(out)
