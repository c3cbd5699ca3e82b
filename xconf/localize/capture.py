"""Forward hooks that capture every tap of one side during one scoring pass.

One pass scores the frozen samples one request at a time, so each forward call belongs to
exactly one sample. transformers runs one forward per sample (``[1, T, H]``; Megatron too,
sequence-first ``[T, 1, H]``, transposed as it is captured); vLLM runs a prefill forward and
then one decode forward per forced token, so its rows are grouped by the positions the
engine fed (a new sample's positions start again from 0) and checked against the frozen
lengths. Only positions ``0 .. T-2`` are kept: those both sides compute in every scoring
mode (decode never feeds the last frozen token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xconf.knobs import ROLLOUT_ENABLE_PREFIX_CACHING
from xconf.localize.errors import LocalizeError
from xconf.localize.names import Flavour, NameMap, SideName, Tap

Rows = dict[str, list[Any]]  # tap key -> one float32 [T-1, width] tensor per sample


def _read(output: Any, read: str) -> Any:
    if read == "tensor":
        return output[0] if isinstance(output, tuple) else output
    if read == "first":
        return output[0] if isinstance(output, tuple | list) else output
    if read == "model_logits":  # a transformers ModelOutput, or a plain tuple
        logits = getattr(output, "logits", None)
        return logits if logits is not None else output[0]
    if read == "scaled_embedding":
        import torch

        return output * torch.tensor(output.shape[-1] ** 0.5, dtype=output.dtype)
    if read == "sum_pair":
        if isinstance(output, tuple | list) and len(output) == 2 and output[1] is not None:
            return output[0] + output[1]
        return output[0] if isinstance(output, tuple | list) else output
    raise LocalizeError("localize.bad_name_map", f"unknown read {read!r}", "localize.names")


def _module(root: Any, name: str, flavour: str) -> Any:
    try:
        return root.get_submodule(name)
    except AttributeError as exc:
        raise LocalizeError(
            "localize.no_such_module",
            f"the {flavour} model {type(root).__name__} has no module {name!r}: "
            "the name map does not fit this checkpoint",
            f"localize.names.{flavour}",
        ) from exc


class Recorder:
    """Hooks for ``taps`` on ``model``; use as a context manager around one scoring pass."""

    def __init__(self, model: Any, names: NameMap, flavour: Flavour, taps: Sequence[Tap]):
        self.model = model
        self.flavour = flavour
        self.taps = tuple(taps)
        self.names = {t.key: names.module(flavour, t) for t in self.taps}
        self.outputs: dict[str, list[Any]] = {t.key: [] for t in self.taps}
        self.positions: list[Any] = []
        self._handles: list[Any] = []

    def _hook(self, key: str, name: SideName) -> Callable[..., None]:
        seq_first = self.flavour == "megatron"

        def hook(module: Any, args: Any, output: Any) -> None:
            value = _read(output, name.read).detach()
            if seq_first and value.dim() == 3:
                value = value.transpose(0, 1)
            self.outputs[key].append(value.to("cpu", copy=True))

        return hook

    def _positions_hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        positions = kwargs.get("positions")
        if positions is None and len(args) > 1:
            positions = args[1]
        if positions is not None:
            self.positions.append(positions.detach().to("cpu", copy=True).reshape(-1))

    def __enter__(self) -> Recorder:
        for key, name in self.names.items():
            if name.read == "logits":
                continue  # computed from the final-norm rows afterwards (see names.py)
            module = _module(self.model, name.module, self.flavour)
            self._handles.append(module.register_forward_hook(self._hook(key, name)))
        if self.flavour == "vllm":
            self._handles.append(
                self.model.register_forward_pre_hook(self._positions_hook, with_kwargs=True)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- assembling ----------------------------------------------------------------------
    def rows(self, lengths: Sequence[int]) -> Rows:
        """Per tap, one float32 ``[T-1, width]`` tensor per sample (``lengths`` are the T)."""
        groups = (
            self._vllm_groups(lengths) if self.flavour == "vllm" else self._forward_groups(lengths)
        )
        out: Rows = {}
        for key, name in self.names.items():
            if name.read == "logits":
                continue
            out[key] = [self._join(key, g, n - 1) for g, n in zip(groups, lengths, strict=True)]
        for key, name in self.names.items():
            if name.read == "logits":  # the engine's logits over its own final-norm rows
                if "final_norm" not in self.names:
                    raise LocalizeError(
                        "localize.bad_name_map", "logits need the final_norm tap", key
                    )
                rows = self._native("final_norm", groups, lengths)
                out[key] = [self._logits(r) for r in rows]
        return {k: [t.float() for t in v] for k, v in out.items()}

    def _native(self, key: str, groups: list[list[int]], lengths: Sequence[int]) -> list[Any]:
        return [
            self._join(key, g, n - 1, float32=False) for g, n in zip(groups, lengths, strict=True)
        ]

    def _logits(self, rows: Any) -> Any:
        import torch

        device = next(self.model.parameters()).device
        with torch.no_grad():
            return self.model.compute_logits(rows.to(device)).detach().to("cpu", copy=True)

    def _join(self, key: str, forwards: list[int], keep: int, float32: bool = True) -> Any:
        import torch

        parts = []
        for f in forwards:
            value = self.outputs[key][f]
            parts.append(value[0] if value.dim() == 3 else value)
        joined = torch.cat(parts, dim=0)[:keep]
        return joined.float() if float32 else joined

    def _count(self) -> int:
        counts = {len(v) for k, v in self.outputs.items() if self.names[k].read != "logits"}
        if len(counts) != 1:
            raise LocalizeError(
                "localize.capture_mismatch",
                f"taps fired unequally often on the {self.flavour} side: {sorted(counts)}",
                f"localize.{self.flavour}",
            )
        count = counts.pop()
        if count == 0:
            raise LocalizeError(
                "localize.taps_not_reached",
                f"no forward hook fired on the {self.flavour} side (a compiled graph bypasses "
                "module hooks: localize needs the eager path)",
                f"localize.{self.flavour}",
            )
        return count

    def _forward_groups(self, lengths: Sequence[int]) -> list[list[int]]:
        """One forward per sample (transformers, Megatron): its width is the sample's length."""
        count = self._count()
        first = self.taps[0].key
        widths = [int(self.outputs[first][f].shape[-2]) for f in range(count)]
        if widths != list(lengths):
            raise LocalizeError(
                "localize.capture_mismatch",
                f"{self.flavour} forwards saw lengths {widths}, the frozen samples are "
                f"{list(lengths)}",
                f"localize.{self.flavour}",
            )
        return [[f] for f in range(count)]

    def _vllm_groups(self, lengths: Sequence[int]) -> list[list[int]]:
        import torch

        count = self._count()
        if len(self.positions) != count:
            raise LocalizeError(
                "localize.capture_mismatch",
                f"{len(self.positions)} model calls for {count} tap captures",
                "localize.vllm",
            )
        # Positions rise within a sample; the next sample's first forward goes back down.
        groups: list[list[int]] = []
        last = None
        for f, pos in enumerate(self.positions):
            if not pos.numel():
                raise LocalizeError(
                    "localize.capture_mismatch", f"forward {f} fed no position", "localize.vllm"
                )
            if last is None or int(pos[0]) <= last:
                groups.append([])
            groups[-1].append(f)
            last = int(pos[-1])
        if len(groups) != len(lengths):
            raise LocalizeError(
                "localize.capture_mismatch",
                f"vllm forwards form {len(groups)} samples, the identity has {len(lengths)}",
                "localize.vllm",
            )
        for index, (group, n) in enumerate(zip(groups, lengths, strict=True)):
            seen = torch.cat([self.positions[f] for f in group])
            start = int(seen[0])
            if start:
                # A cached prefix is never recomputed: its activations do not exist to compare.
                raise LocalizeError(
                    "localize.prefix_cache_hit",
                    f"vLLM served positions 0..{start - 1} of sample {index} from its prefix "
                    "cache, so their activations were not computed; localize compares every "
                    "position and cannot localize a prefix-caching case whose samples share "
                    "a cached prefix",
                    ROLLOUT_ENABLE_PREFIX_CACHING.path,
                )
            if seen.numel() not in (n - 1, n) or not torch.equal(seen, torch.arange(seen.numel())):
                raise LocalizeError(
                    "localize.capture_mismatch",
                    f"vllm fed positions {seen.tolist()} for a sample of {n} tokens "
                    "(one request at a time)",
                    "localize.vllm",
                )
        return groups
