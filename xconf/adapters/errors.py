"""Typed errors raised by the real-runtime building blocks (vLLM, Hugging Face, models)."""

from __future__ import annotations

from xconf.errors import IdentityViolation, XconfError


class AdapterError(XconfError):
    """Base class of every error raised under ``xconf.adapters``."""


class RuntimeUnavailableError(AdapterError):
    """A runtime package (vllm, transformers) is missing or cannot be imported."""


class ModelFactoryError(AdapterError):
    """A tiny checkpoint could not be built, saved or verified."""


class UnsupportedKnobError(AdapterError):
    """A knob value that this runtime cannot materialize on this device."""


class ScoringError(AdapterError):
    """A scorer could not score the frozen tokens (shape, mode, engine output)."""


class IdentityViolationError(AdapterError, IdentityViolation):
    """A scorer did not score the frozen identity (tokens changed, model mutated)."""


class ReadOnlyViolationError(IdentityViolationError):
    """The training scorer changed a parameter, a buffer or the module's mode."""
