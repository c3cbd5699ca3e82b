"""The coded error of ``xconf fix``: bad input, and a search that cannot be run."""

from __future__ import annotations

from xconf.errors import XconfError


class FixError(XconfError):
    """The fix search cannot run or cannot show what it claims (code ``fix.*``)."""
