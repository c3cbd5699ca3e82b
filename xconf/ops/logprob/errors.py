"""Typed errors of the selected-logprob operator package; every one carries a stable code."""

from __future__ import annotations

from xconf.errors import XconfError


class LogprobContractError(XconfError):
    """A contract or spec is malformed."""


class LogprobValidationError(XconfError):
    """A call's tensors do not satisfy the contract."""


class LogprobPreflightError(XconfError):
    """Ranks of one tensor-parallel group disagree before any data collective."""
