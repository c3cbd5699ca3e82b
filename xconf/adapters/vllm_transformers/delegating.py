"""An engine that is another engine underneath: the wrappers' one shared delegation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from xconf.experiment import Identity
from xconf.runtime.protocol import (
    Engine,
    FrozenInputs,
    ReadbackValue,
    SelectedLogprobOp,
    SideScore,
)


class Delegating:
    """Scores, reads back and closes through ``inner``; a subclass changes what it must."""

    def __init__(self, inner: Engine) -> None:
        self._inner = inner

    @property
    def wrapped(self) -> Any:
        """The engine underneath (``xconf localize`` hooks the module inside it)."""
        return self._inner

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> SideScore:
        with self._scoring():
            return self._inner.score(inputs, identity, batch_size, operator)

    @contextlib.contextmanager
    def _scoring(self) -> Iterator[None]:
        """Around every score call (a subclass times it)."""
        yield

    def readback(self) -> Mapping[str, ReadbackValue]:
        return self._inner.readback()

    def close(self) -> None:
        self._inner.close()
