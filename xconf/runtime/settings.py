"""The name rule of a side's settings: which field of a side's settings record a knob's
materialized value lands in.

Each side declares its own settings record (``runtime/side.SideSpec.settings``: the vLLM
side's ``VllmSettings``, the transformers side's ``HfSettings``, ...): a frozen dataclass with
one field per knob its handlers honour, named by :func:`setting_name` (the path without its
side: ``rollout.dtype`` -> ``dtype``), each field's default the engine's own. A field holds
what the side's handler materialized, which may differ from the request (``native``
attention is ``sdpa``). An engine is built from that record
(``runtime/materialization.settings_for``), never from a mapping keyed by knob paths;
``tests/core/test_settings.py`` checks every side's record against its handlers and the
knob table.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from xconf.knobs import KnobSpec

C = TypeVar("C")


def setting_name(spec: KnobSpec) -> str:
    """The settings field of a knob: its path without the side (``logp.backend`` keeps its
    namespace: ``logp_backend``)."""
    head, _, rest = spec.path.partition(".")
    return rest if head in ("rollout", "training") else spec.path.replace(".", "_")


def built_from(config: type[C], settings: Any, **construction: Any) -> C:
    """An engine's construction record (``config``, a dataclass) from a side's settings:
    every settings field that is a field of ``config``, by name, and the ``construction``
    options no knob sets (the checkpoint, the device). No knob is copied by hand."""
    built = {f.name for f in fields(config)}  # type: ignore[arg-type]
    taken = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name in built}
    return config(**taken, **construction)
