"""xconf's own Hugging Face -> Megatron weight mapping, loaded and then checked tensor by tensor.

:func:`weight_plan` says, for one tensor-parallel rank, where every parameter of Megatron's
``GPTModel`` (local spec) comes from: slices of checkpoint tensors, concatenated along one
dimension. The mapping is the layout Megatron's layers compute with:

* ``linear_qkv`` (column-parallel) holds, per query group, that group's query heads, then its
  key head, then its value head; a rank holds ``groups / tp`` whole groups;
* ``linear_fc1`` (column-parallel, gated) holds this rank's slice of ``gate_proj`` followed by
  the same slice of ``up_proj`` (``cat(gate, up)`` per shard, not of the whole tensors);
* ``linear_proj`` and ``linear_fc2`` (row-parallel) hold a slice of the input columns;
* the word embeddings and the output layer hold a contiguous slice of the vocabulary rows;
* norms are whole on every rank.

:func:`load_weights` copies every slice into the model (cast to its dtype); :func:`verify_weights`
reads the checkpoint again and proves every parameter equals its source, bit for bit, every
parameter has a source and every checkpoint tensor was used (a tensor nothing maps, such as a
bias the spec has no place for, is a coded refusal naming it).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.adapters.errors import ModelFactoryError
from xconf.adapters.megatron.arch import UNMAPPABLE, MegatronArch


@dataclass(frozen=True)
class Piece:
    """Rows (or columns) ``start:stop`` of one checkpoint tensor along the source's dim."""

    tensor: str
    start: int
    stop: int


@dataclass(frozen=True)
class Source:
    """A parameter's value: its pieces concatenated along ``dim`` (whole tensors: one piece
    spanning the dimension)."""

    dim: int
    pieces: tuple[Piece, ...]

    @property
    def tensors(self) -> frozenset[str]:
        return frozenset(p.tensor for p in self.pieces)


def _span(size: int, tp: int, rank: int) -> tuple[int, int]:
    per = size // tp
    return rank * per, (rank + 1) * per


def _qkv(arch: MegatronArch, layer: int, kind: str, tp: int, rank: int) -> Source:
    """Per query group: its query heads, its key head, its value head (this rank's groups)."""
    attn = f"model.layers.{layer}.self_attn."
    per_group = arch.num_heads // arch.num_kv_heads
    q_rows, kv_rows = per_group * arch.head_dim, arch.head_dim
    lo, hi = _span(arch.num_kv_heads, tp, rank)
    pieces: list[Piece] = []
    for g in range(lo, hi):
        pieces.append(Piece(f"{attn}q_proj.{kind}", g * q_rows, (g + 1) * q_rows))
        pieces.append(Piece(f"{attn}k_proj.{kind}", g * kv_rows, (g + 1) * kv_rows))
        pieces.append(Piece(f"{attn}v_proj.{kind}", g * kv_rows, (g + 1) * kv_rows))
    return Source(0, tuple(pieces))


def weight_plan(
    arch: MegatronArch, shapes: Mapping[str, tuple[int, ...]], tp: int = 1, rank: int = 0
) -> dict[str, Source]:
    """Megatron parameter name -> its source on TP rank ``rank`` of ``tp``; ``shapes`` are
    the checkpoint's tensors (name -> shape)."""

    def whole(name: str) -> Source:
        return Source(0, (Piece(name, 0, shapes[name][0]),))

    def rows(name: str, size: int) -> Source:
        return Source(0, (Piece(name, *_span(size, tp, rank)),))

    def cols(name: str, size: int) -> Source:
        return Source(1, (Piece(name, *_span(size, tp, rank)),))

    plan = {
        "embedding.word_embeddings.weight": rows("model.embed_tokens.weight", arch.vocab_size),
        "decoder.final_layernorm.weight": whole("model.norm.weight"),
    }
    if not arch.tied_embeddings:
        plan["output_layer.weight"] = rows("lm_head.weight", arch.vocab_size)
    ffn, attn_width = arch.ffn_hidden_size, arch.num_heads * arch.head_dim
    for i in range(arch.num_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        mine = _span(ffn, tp, rank)  # the same rows of gate_proj and of up_proj
        plan |= {
            f"{mg}input_layernorm.weight": whole(f"{hf}input_layernorm.weight"),
            f"{mg}pre_mlp_layernorm.weight": whole(f"{hf}post_attention_layernorm.weight"),
            f"{mg}self_attention.linear_qkv.weight": _qkv(arch, i, "weight", tp, rank),
            f"{mg}self_attention.linear_proj.weight": cols(
                f"{hf}self_attn.o_proj.weight", attn_width
            ),
            f"{mg}mlp.linear_fc1.weight": Source(
                0,
                (
                    Piece(f"{hf}mlp.gate_proj.weight", *mine),
                    Piece(f"{hf}mlp.up_proj.weight", *mine),
                ),
            ),
            f"{mg}mlp.linear_fc2.weight": cols(f"{hf}mlp.down_proj.weight", ffn),
        }
        if arch.qkv_bias:
            plan[f"{mg}self_attention.linear_qkv.bias"] = _qkv(arch, i, "bias", tp, rank)
        if arch.qk_layernorm:
            plan[f"{mg}self_attention.q_layernorm.weight"] = whole(f"{hf}self_attn.q_norm.weight")
            plan[f"{mg}self_attention.k_layernorm.weight"] = whole(f"{hf}self_attn.k_norm.weight")
    return plan


class CheckpointTensors:
    """The checkpoint's safetensors files, read slice by slice (never a pickle)."""

    def __init__(self, root: Path | str) -> None:
        from xconf.adapters.models.local import weight_files

        self.root = Path(root)
        self.files = weight_files(self.root)
        self._stack = ExitStack()
        self._where: dict[str, Any] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}

    def __enter__(self) -> CheckpointTensors:
        from safetensors import safe_open

        for path in self.files:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
            for name in handle.keys():  # noqa: SIM118 - a safetensors handle, no dict
                self._where[name] = handle
                self._shapes[name] = tuple(handle.get_slice(name).get_shape())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def read(self, source: Source) -> Any:
        """The parameter's value as the checkpoint holds it (its own dtype)."""
        import torch

        parts = []
        for piece in source.pieces:
            view = self._where[piece.tensor].get_slice(piece.tensor)
            if source.dim == 0:
                parts.append(view[piece.start : piece.stop])
            else:
                parts.append(view[:, piece.start : piece.stop])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=source.dim)


def _refuse(root: Path, what: str, message: str) -> ModelFactoryError:
    return ModelFactoryError(UNMAPPABLE, message, f"{root}:{what}")


def _check_coverage(
    root: Path, plan: Mapping[str, Source], params: Mapping[str, Any], shapes: Mapping[str, Any]
) -> None:
    """Every parameter has a source, every source exists, every checkpoint tensor is used."""
    unplanned = sorted(set(params) - set(plan))
    if unplanned:
        raise _refuse(root, unplanned[0], f"no checkpoint source for Megatron's {unplanned}")
    needed = {t for s in plan.values() for t in s.tensors}
    missing = sorted(needed - set(shapes))
    if missing:
        raise _refuse(root, missing[0], f"the checkpoint has no tensor {missing}")
    # A tied checkpoint may still carry lm_head.weight (a copy of the embeddings, checked).
    unused = sorted(set(shapes) - needed - {"lm_head.weight"})
    if unused:
        raise _refuse(
            root, unused[0], f"checkpoint tensors with no place in Megatron's spec: {unused}"
        )


def load_weights(model: Any, root: Path | str, arch: MegatronArch, tp: int, rank: int) -> int:
    """Copy this rank's slice of every checkpoint tensor into ``model``; the parameter count."""
    import torch

    params = dict(model.named_parameters())
    with CheckpointTensors(root) as ckpt, torch.no_grad():
        plan = weight_plan(arch, ckpt.shapes, tp, rank)
        _check_coverage(Path(root), plan, params, ckpt.shapes)
        for name, source in plan.items():
            value = ckpt.read(source)
            if tuple(value.shape) != tuple(params[name].shape):
                raise _refuse(
                    Path(root),
                    name,
                    f"{name}: the checkpoint gives {tuple(value.shape)}, "
                    f"Megatron built {tuple(params[name].shape)}",
                )
            params[name].copy_(value)
        if arch.tied_embeddings and "lm_head.weight" in ckpt.shapes:
            _check_tied(Path(root), ckpt)
    return len(plan)


def _check_tied(root: Path, ckpt: CheckpointTensors) -> None:
    """A tied checkpoint's stored lm_head must be the embeddings (else it is not tied)."""
    import torch

    shape = ckpt.shapes["lm_head.weight"]
    head = ckpt.read(Source(0, (Piece("lm_head.weight", 0, shape[0]),)))
    emb = ckpt.read(Source(0, (Piece("model.embed_tokens.weight", 0, shape[0]),)))
    if head.shape != emb.shape or not torch.equal(head, emb):
        raise _refuse(
            root,
            "lm_head.weight",
            "tie_word_embeddings is true but lm_head.weight differs from the embeddings",
        )


@dataclass(frozen=True)
class WeightCheck:
    """The tensor-by-tensor proof: parameters compared, checkpoint tensors they came from."""

    parameters: int
    tensors: int
    mismatched: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatched


def _bits(t: Any) -> Any:
    import torch

    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat


def verify_weights(
    model: Any, root: Path | str, arch: MegatronArch, tp: int, rank: int
) -> WeightCheck:
    """Read the checkpoint again: every parameter must equal its source (cast to the
    parameter's dtype) bit for bit."""
    import torch

    params = dict(model.named_parameters())
    mismatched: list[str] = []
    with CheckpointTensors(root) as ckpt:
        plan = weight_plan(arch, ckpt.shapes, tp, rank)
        _check_coverage(Path(root), plan, params, ckpt.shapes)
        for name, source in plan.items():
            want = ckpt.read(source).to(params[name].dtype)
            got = params[name]
            if tuple(want.shape) != tuple(got.shape) or not torch.equal(_bits(want), _bits(got)):
                mismatched.append(name)
        used = {t for s in plan.values() for t in s.tensors}
    return WeightCheck(len(plan), len(used), tuple(mismatched))
