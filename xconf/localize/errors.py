"""The coded error of ``xconf localize``: bad input and replays that cannot be trusted."""

from __future__ import annotations

from xconf.errors import XconfError


class LocalizeError(XconfError):
    """Localization cannot run or cannot show what it claims (code ``localize.*``)."""
