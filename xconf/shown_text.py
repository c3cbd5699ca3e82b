"""Text from a file, a runtime or a model, made safe to show; and bounded to store.

The one owner of both rules. Everything xconf shows that it did not write itself (error
messages, tensor names, paths, knob labels, token text) goes through :func:`shown` on its
way to a terminal or a page: C0 and C1 control characters (ANSI / OSC sequences start with
ESC or CSI: a clipboard write, a screen clear, a hidden link), DEL, line and paragraph
separators and the bidirectional controls (U+202E and friends, which reorder what is
displayed) are replaced by a visible escape (``\\x1b``, ``\\u202e``). Newlines and tabs stay.
The terminal gets it through :func:`console` (every segment rich renders, so a table
cell is covered too), ``report.html`` through its template's ``finalize``, token text
through the report's decoders.

What is stored stays verbatim, but bounded: :func:`bounded` keeps the head and the tail
of a long message with its full length, so a runtime that raises with a 40 MB message
still seals a small, verifiable attempt.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
MESSAGE_HEAD = 4096
MESSAGE_TAIL = 2048


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with every control and bidi character replaced by a visible escape."""
    return _UNSAFE.sub(_escape, text)


def bounded(text: str, head: int = MESSAGE_HEAD, tail: int = MESSAGE_TAIL) -> str:
    """``text`` whole when short; else its head and tail around a note of what was cut."""
    if len(text) <= head + tail + 200:
        return text
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} of {len(text)} characters omitted ...]\n{text[-tail:]}"


def console(**options: Any) -> Console:
    """A rich console (markup off) whose every rendered text segment is :func:`shown`."""
    return _console_class()(markup=False, **options)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console as RichConsole
    from rich.segment import Segment

    class ShownConsole(RichConsole):
        def render(self, renderable: Any, options: Any = None) -> Any:
            for segment in super().render(renderable, options):
                if segment.control or not _UNSAFE.search(segment.text):
                    yield segment
                else:
                    yield Segment(shown(segment.text), segment.style, segment.control)

    return ShownConsole
