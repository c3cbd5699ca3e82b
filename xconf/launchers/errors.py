"""Typed launcher errors; each names the config path (or launcher setting) at fault."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xconf.errors import XconfError


class LaunchError(XconfError):
    """A case's processes could not be launched or did not finish cleanly."""


class TopologyError(LaunchError):
    """The composed config asks for a topology the launcher cannot derive or honour."""


class RankFailedError(LaunchError):
    """One or more ranks of a launched world failed (raised, exited, or were killed)."""


class LaunchTimeoutError(LaunchError):
    """The launcher's watchdog expired and killed the world."""


class CaseDisagreementError(LaunchError):
    """Ranks of one world are not running the same case (config digests differ)."""


def check_settings(settings: Any, checks: Iterable[tuple[str, bool]]) -> None:
    """Refuse the first launcher setting whose check failed, naming it and its value."""
    for name, ok in checks:
        if not ok:
            raise LaunchError(
                "launch.settings.invalid",
                f"invalid value {getattr(settings, name)!r}",
                f"hydra.launcher.{name}",
            )
