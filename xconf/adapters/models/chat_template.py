"""Chat templates are code from a checkpoint: render them sandboxed, bounded, coded.

A tokenizer's Jinja chat template is rendered here, never by ``apply_chat_template``
(which has neither a time nor a size bound), in an ``ImmutableSandboxedEnvironment``
configured as transformers configures its own (``trim_blocks``, ``lstrip_blocks``, loop
controls, the ``generation`` tag, ``raise_exception``, ``tojson``, ``strftime_now``) and
given the same variables (the special tokens, ``messages``, ``tools``, ``documents``,
``add_generation_prompt``), so an ordinary template renders exactly the same text. On
top of the sandbox (no attribute walk to ``__subclasses__``, no loader, so no
``include`` / ``import`` / ``extends``):

- a time bound (``RENDER_TIMEOUT_S``), checked by a trace function on every line the
  template's Python code runs, so a loop that never ends is stopped;
- a size bound (``MAX_RENDERED_CHARS``) on the output as it streams, and on the operands
  of ``*``, ``**`` and ``%`` and the arguments of every call and filter (integers, format
  widths, a string operation's estimated result), so no single operation builds a huge
  value (or runs a huge power) in C, where no trace can stop it.

Every failure (syntax error, ``raise_exception``, a sandbox refusal, an include, the time
or size bound, any other exception) is a coded :class:`~xconf.errors.ConfigError`
(``tokenizer.chat_template``) naming the template's file: exit 2, never a traceback.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from xconf.errors import ConfigError

RENDER_TIMEOUT_S = 5.0
MAX_RENDERED_CHARS = 1 << 20
MAX_TEMPLATE_CHARS = 1 << 20
CALL_RESULT_BOUND = 16 * MAX_RENDERED_CHARS
# No integer a chat template passes to a call, a filter or a '%' format is this large
# (indents, widths, counts): ``tojson(indent=N)`` multiplies by the lines JSON makes.
MAX_ARGUMENT_INT = 1 << 16
CODE = "tokenizer.chat_template"


class _Expired(BaseException):
    """Raised into the template's frames by the tracer; a BaseException, so no
    ``except Exception`` inside Jinja can swallow it."""


class _TooLarge(Exception):
    pass


def template_file(tokenizer: Any) -> str:
    """The file the tokenizer's chat template came from, for messages."""
    base = Path(str(getattr(tokenizer, "name_or_path", "") or "tokenizer"))
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if (base / name).is_file():
            return str(base / name)
    return str(base)


def chat_template(tokenizer: Any) -> str | None:
    """The tokenizer's chat template text (the ``default`` one of a named set), or None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def render_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, where: str | None = None
) -> str:
    """``messages`` rendered by the tokenizer's chat template with a generation prompt."""
    source = template_file(tokenizer)
    template = chat_template(tokenizer)
    if template is None:
        raise ConfigError(CODE, f"{source} has no chat template", where or source)
    special = getattr(tokenizer, "special_tokens_map", None)
    context: dict[str, Any] = dict(special) if isinstance(special, Mapping) else {}
    context.update(
        messages=[dict(m) for m in messages],
        tools=None,
        documents=None,
        add_generation_prompt=True,
    )
    return render_template(template, context, source=source, where=where)


def render_template(
    template: str, context: Mapping[str, Any], *, source: str, where: str | None = None
) -> str:
    """``template`` rendered with ``context`` under the bounds above; coded on any failure."""

    def refused(why: str) -> ConfigError:
        return ConfigError(CODE, f"the chat template in {source} {why}", where or source)

    if len(template) > MAX_TEMPLATE_CHARS:
        raise refused(f"is {len(template)} characters, more than {MAX_TEMPLATE_CHARS}")
    budget = _Budget(RENDER_TIMEOUT_S)
    previous = sys.gettrace()
    sys.settrace(budget)
    try:
        compiled = _compile(template)
        pieces, size = [], 0
        for piece in compiled.generate(**context):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                raise _TooLarge(f"output over {MAX_RENDERED_CHARS} characters")
            pieces.append(piece)
        return "".join(pieces)
    except _Expired:
        raise refused(f"ran longer than {RENDER_TIMEOUT_S:g} s and was stopped") from None
    except _TooLarge as exc:
        raise refused(f"was stopped: {exc}") from None
    except RecursionError:
        raise refused("recursed too deep") from None
    except Exception as exc:  # syntax errors, raise_exception, sandbox refusals, type errors
        raise refused(f"failed: {_describe(exc)}") from None
    finally:
        sys.settrace(previous)


def _describe(exc: Exception) -> str:
    line = getattr(exc, "lineno", None)
    at = f" (line {line})" if isinstance(line, int) else ""
    return f"{type(exc).__name__}{at}: {exc}"


class _Budget:
    """A trace function that raises :class:`_Expired` once the deadline has passed."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.events = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        self.events += 1
        if self.events & 0xFF == 0 and time.monotonic() > self.deadline:
            raise _Expired
        return self


def _check_size(value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ARGUMENT_INT:
        raise _TooLarge(f"an integer argument of {value.bit_length()} bits")


# A width or precision of seven digits or more in a %-format or a format spec.
_WIDE_FORMAT = re.compile(r"(?:%|\{[^{}]*:)[^a-zA-Z%{}]*?\d{7}")


def _check_call(name: str, receiver: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse a call that could build a huge value inside C, before it runs.

    Every integer argument is bounded; a call on (or of) a string is refused when its
    result could exceed ``CALL_RESULT_BOUND`` characters, estimated as the string's length
    times one plus its largest integer or string argument (``replace('', 'x' * N)``,
    ``indent(N)``, ``expandtabs(N)`` multiply); so is a format (``str.format``, the
    ``format`` filter) with a width of a million or more.
    """
    values = (*args, *kwargs.values())
    for value in values:
        _check_size(value)
    text = next((v for v in (receiver, *values) if isinstance(v, str)), None)
    if text is None:
        return
    if name in ("format", "format_map") and _WIDE_FORMAT.search(text):
        raise _TooLarge("a format width of a million or more")
    factor = max(
        [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
        + [len(v) for v in values if isinstance(v, str) and v is not text]
        + [0]
    )
    if (len(text) + 1) * (1 + factor) > CALL_RESULT_BOUND:
        raise _TooLarge("a string operation whose result could exceed the size bound")


def _bounded(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)  # keeps jinja's pass_context / pass_eval_context marker
    def call(*args: Any, **kwargs: Any) -> Any:
        _check_call(name, None, args, kwargs)
        return fn(*args, **kwargs)

    return call


@functools.lru_cache(maxsize=16)
def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """transformers' ``{% generation %}`` block: renders its body unchanged."""

        tags = {"generation"}  # noqa: RUF012 (jinja reads it from the class)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Bounded(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "%":
                if isinstance(left, str) and _WIDE_FORMAT.search(left):
                    raise _TooLarge("a format width of a million or more")
                for value in right if isinstance(right, tuple) else (right,):
                    _check_size(value)  # a '*' width
            elif operator == "**":
                _check_size(left)
                if isinstance(right, int) and abs(right) > 64:
                    raise _TooLarge(f"a power with exponent {right}")
            else:
                counts = [v for v in (left, right) if isinstance(v, int)]
                sized = [v for v in (left, right) if isinstance(v, str | list | tuple)]
                if sized and counts and len(sized[0]) * abs(counts[0]) > MAX_RENDERED_CHARS:
                    raise _TooLarge("a repetition over the size bound")
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value: Any) -> Any:
            # str.format / format_map reach the template through this wrapper (not call).
            wrapped = super().wrap_str_format(value)
            if wrapped is not None and _WIDE_FORMAT.search(value.__self__):

                def refused(*args: Any, **kwargs: Any) -> Any:
                    raise _TooLarge("a format width of a million or more")

                return refused
            return wrapped

        def call(self, context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
            name = str(getattr(obj, "__name__", ""))
            _check_call(name, getattr(obj, "__self__", None), args, kwargs)
            return super().call(context, obj, *args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # As transformers' own: not Jinja's (which escapes HTML characters).
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = Bounded(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.filters = {name: _bounded(fn, name) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    return _environment().from_string(template)
