"""Each knob path is spelled once in the package's source: in its row of the knob table.

Code names a knob by its handle (``ROLLOUT_DTYPE.path``, ``xconf/knobs.py``) and a reading by
its readback name (``xconf/runtime/readback.py``), so a knob is renamed in one place and no
module can quietly key a dict by a path the table does not know."""

from __future__ import annotations

import re
from pathlib import Path

from xconf.knobs import KNOBS
from xconf.runtime.readback import READBACKS

ROOT = Path(__file__).resolve().parents[2]
TREES = ("xconf", "hydra_plugins")
TABLE = ROOT / "xconf" / "knobs.py"


def _literal(text: str) -> re.Pattern[str]:
    return re.compile(rf"[\"']{re.escape(text)}[\"']")


def _sources() -> list[Path]:
    return [p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))]


def literal_counts(paths: list[str]) -> dict[tuple[str, str], int]:
    """(file relative to the root, path) -> how many times the path is written as a literal."""
    found: dict[tuple[str, str], int] = {}
    for source in _sources():
        text = source.read_text(encoding="utf-8")
        for path in paths:
            n = len(_literal(path).findall(text))
            if n:
                found[(str(source.relative_to(ROOT)), path)] = n
    return found


def test_each_knob_path_is_a_literal_only_in_its_table_row() -> None:
    counts = literal_counts(list(KNOBS))
    table = str(TABLE.relative_to(ROOT))
    outside = {key: n for key, n in counts.items() if key[0] != table}
    assert outside == {}, f"knob paths written as literals outside the knob table: {outside}"
    assert {path: counts.get((table, path), 0) for path in KNOBS} == dict.fromkeys(KNOBS, 1)


def test_readback_names_are_not_knobs_and_live_in_their_own_table() -> None:
    assert set(READBACKS).isdisjoint(KNOBS)
    table = "xconf/runtime/readback.py"
    outside = {k: n for k, n in literal_counts(list(READBACKS)).items() if k[0] != table}
    assert outside == {}, f"readback names written as literals outside their table: {outside}"


def test_the_count_sees_a_literal_and_ignores_other_strings() -> None:
    pattern = _literal("rollout.dtype")
    assert pattern.findall("x = {\"rollout.dtype\": 1, 'rollout.dtype': 2}") == [
        '"rollout.dtype"',
        "'rollout.dtype'",
    ]
    assert not pattern.findall('f"rollout.{name}" "rollout.dtype_x" ROLLOUT_DTYPE.path')
