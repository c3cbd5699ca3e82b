"""Typed errors. Every error carries a stable code and names the offending path."""

from __future__ import annotations

from dataclasses import dataclass

from xconf.shown_text import bounded


class XconfError(Exception):
    """Base error: ``code`` is stable and machine-readable; ``path`` names the bad key.

    The message and the path are stored bounded (:func:`~xconf.shown_text.bounded`: their
    head and tail around a note of what was cut): a name or value read from a hostile file
    (a 76-million-character tensor name) never makes a 76-million-character error line."""

    def __init__(self, code: str, message: str, path: str | None = None) -> None:
        self.code = code
        self.message = bounded(str(message))
        self.path = None if path is None else bounded(str(path), 512, 256)
        message, path = self.message, self.path
        where = f" at '{path}'" if path else ""
        super().__init__(f"[{code}]{where}: {message}")

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "path": self.path, "message": self.message}


class ConfigError(XconfError):
    """Invalid experiment document or Hydra configuration."""


@dataclass(frozen=True)
class PlanIssue:
    """One structured planning problem; planning reports all of them at once."""

    code: str
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "path": self.path, "message": self.message}


class PlanError(XconfError):
    """Planning found one or more issues; ``issues`` lists every one."""

    def __init__(self, issues: tuple[PlanIssue, ...]) -> None:
        self.issues = issues
        first = issues[0]
        extra = f" (+{len(issues) - 1} more)" if len(issues) > 1 else ""
        super().__init__(first.code, first.message + extra, first.path)


class OperatorResolutionError(XconfError):
    """A semantic operator could not be resolved strictly."""


class RuntimeMaterializationError(XconfError):
    """A runtime could not honour a case under strict execution."""


class IdentityViolation(XconfError):
    """A side did not score the frozen identity it claims (wrong checkpoint, mutated inputs,
    changed state, diverged forced decoding): the case is ``invalid_identity``, never drift."""


class ArtifactError(XconfError):
    """An artifact could not be written or read safely."""
