"""Engines that are another engine underneath: each forwards the whole engine protocol.

A runtime wraps the engine a side builds (a timer around it, the placement on the side's
ranks): the runner holds the wrapper, so every method of ``protocol.Engine`` (``reset_state``
too, which the engine cache calls before every reuse) must reach the engine inside.
``tests/core/test_engine_cache.py`` checks each wrapper here and the runtimes' own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xconf.errors import XconfError
from xconf.experiment import Identity
from xconf.runtime.protocol import (
    Engine,
    FrozenInputs,
    ReadbackValue,
    SelectedLogprobOp,
    SideScore,
)
from xconf.runtime.ranks import SideGroup, from_rank0

if TYPE_CHECKING:
    import torch


class Delegating:
    """Scores, reads back, resets and closes through ``inner``; a subclass changes what it
    must (a timer wraps ``_scoring``)."""

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

    def reset_state(self) -> None:
        self._inner.reset_state()

    def embedded_tokens(self) -> Sequence[tuple[torch.Tensor, torch.Tensor]] | None:
        return self._inner.embedded_tokens()

    def close(self) -> None:
        self._inner.close()


class OnSideRanks:
    """An engine that lives only on its side's ranks (``0 .. size - 1`` of the launched world).

    ``build(group)`` constructs the real engine on member ranks (``group`` is the side's
    sub-group, None for the whole world). The ranks outside the side build nothing and
    receive rank 0's score and readback, so every rank reaches the same verdict without
    joining the side's collectives.
    """

    def __init__(self, build: Callable[[Any], Engine], side: SideGroup) -> None:
        self.side = side
        self.engine: Engine | None = build(side.group) if side.member else None

    @classmethod
    def on(cls, ranks: int, build: Callable[[Any], Engine]) -> OnSideRanks:
        """The engine ``build(group)`` makes, on launched ranks ``0 .. ranks - 1``."""
        from xconf.runtime.ranks import side_group

        return cls(build, side_group(ranks))

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> SideScore:
        score = self.engine.score(inputs, identity, batch_size, operator) if self.engine else None
        if self.side.is_sub_group:
            score = from_rank0(score)
        if score is None:  # pragma: no cover - rank 0 is a member of every side group
            raise XconfError("runtime.no_score", "no member rank scored", "launcher")
        return score

    def readback(self) -> Mapping[str, ReadbackValue]:
        live = self.engine.readback() if self.engine else None
        if self.side.is_sub_group:
            live = from_rank0(live)
        return live or {}

    def reset_state(self) -> None:
        if self.engine is not None:  # the ranks outside the side hold nothing to reset
            self.engine.reset_state()

    def embedded_tokens(self) -> Sequence[tuple[torch.Tensor, torch.Tensor]] | None:
        # Each member rank checks its own model's record; the others embedded nothing.
        return self.engine.embedded_tokens() if self.engine is not None else None

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
