"""One deterministic optimizer step on the training side (issue 32, item 2): W0 -> W1.

Outside the read-only scorer (which never updates a weight): the checkpoint W0 is loaded in
float32 with transformers, the recorded loss (``mean_nll``: the mean negative log-likelihood
of the frozen batch's active response tokens, teacher-forced) is taken once, one step of the
recorded optimizer (``sgd`` or ``adamw``, with its learning rate) is applied, and W1 is
written as an ordinary Hugging Face directory: W0's JSON files and one safetensors file
holding exactly W0's tensor names (a tied ``lm_head`` stays tied: it is not written), never a
pickle. The directory is published atomically (written under a temporary name, renamed).

``StepRecord.pre_update_state`` is what an identity records: W0's digest, the rule and the
frozen tokens' digest, and W1's digest, so the identity's digest covers the step.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.canonical import canonical_digest
from xconf.errors import ConfigError

RULE = "xconf-one-step/1"
OPTIMIZERS = ("sgd", "adamw")
LOSSES = ("mean_nll",)
STEP_KEYS = frozenset({"optimizer", "lr", "loss"})
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class StepRule:
    """The recorded step: optimizer, learning rate and loss (float32, one step)."""

    optimizer: str = "sgd"
    lr: float = 1e-3
    loss: str = "mean_nll"

    def describe(self) -> str:
        return f"{RULE} optimizer={self.optimizer} lr={self.lr!r} loss={self.loss} dtype=float32"


def parse_step(node: Any, where: str = "identity.recipe.update") -> StepRule:
    """A strict step rule: unknown keys and bad values are coded errors naming the key."""
    if not isinstance(node, Mapping):
        raise ConfigError("config.wrong_type", "expected a mapping", where)
    for key in node:
        if key not in STEP_KEYS:
            raise ConfigError("config.unknown_key", f"unknown step key '{key}'", f"{where}.{key}")
    optimizer = node.get("optimizer", "sgd")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(
            "config.invalid_value", f"optimizer is one of {OPTIMIZERS}", f"{where}.optimizer"
        )
    lr = node.get("lr", 1e-3)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < float(lr) < 1:
        raise ConfigError("config.invalid_value", "lr is a number in (0, 1)", f"{where}.lr")
    loss = node.get("loss", "mean_nll")
    if loss not in LOSSES:
        raise ConfigError("config.invalid_value", f"loss is one of {LOSSES}", f"{where}.loss")
    return StepRule(str(optimizer), float(lr), str(loss))


@dataclass(frozen=True)
class StepRecord:
    """One step taken: where W1 is and what it is."""

    path: Path  # W1's directory
    rule: StepRule
    w0_digest: str  # sha256 of W0's tensors (canonical over names, dtypes, shapes, bytes)
    tokens_digest: str  # of the frozen rows the loss read
    w1_digest: str
    loss: float  # the loss at W0

    @property
    def pre_update_state(self) -> str:
        return (
            f"W0 sha256:{self.w0_digest}; {self.rule.describe()} "
            f"on frozen tokens sha256:{self.tokens_digest}; W1 sha256:{self.w1_digest}"
        )


def tensors_digest(tensors: Mapping[str, Any]) -> str:
    """One digest of a state: every tensor's name, dtype, shape and bytes, by name."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tokens_digest(rows: Mapping[str, Any]) -> str:
    return canonical_digest({k: [list(map(int, r)) for r in v] for k, v in rows.items()})


def _loss(model: Any, rows: Mapping[str, Any]) -> Any:
    import torch

    ids = torch.tensor(rows["token_ids"], dtype=torch.int64)
    attention = torch.tensor(rows["attention_mask"], dtype=torch.int64)
    positions = torch.tensor(rows["position_ids"], dtype=torch.int64)
    selected = torch.tensor(rows["selected_token_ids"], dtype=torch.int64)
    active = torch.tensor(rows["active_mask"], dtype=torch.bool)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, selected[..., None])[..., 0]
    return -(logp[active].sum() / active.sum())


def take_step(w0: Path, rows: Mapping[str, Any], rule: StepRule, root: Path) -> StepRecord:
    """W1 = one ``rule`` step from ``w0`` on the frozen ``rows`` (a ``FrozenBatch.layout()``),
    published under ``root`` (a directory named by W0, the rule and the tokens; a W1 already
    there with the recorded digest is taken as it is)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from xconf.adapters.models.local import weight_files
    from xconf.artifacts.safe_io import publish_bytes
    from xconf.artifacts.tensor_file import tensor_parts

    names: dict[str, Any] = {}
    for file in weight_files(w0):
        names.update(load_file(str(file)))
    w0_digest, tok_digest = tensors_digest(names), tokens_digest(rows)
    key = canonical_digest({"w0": w0_digest, "rule": rule.describe(), "tokens": tok_digest})
    final = root / f"one-step-{key[:24]}"
    # Deterministic kernels for the step only: the setting is process-wide, and the caller's
    # (a scorer in the same process, another test) is put back whatever happens.
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(w0), torch_dtype=torch.float32)
        model.train(False)  # no dropout: the step is a function of W0, the rule and the tokens
        params = [p for p in model.parameters() if p.requires_grad]
        if rule.optimizer == "sgd":
            opt: Any = torch.optim.SGD(params, lr=rule.lr)
        else:
            opt = torch.optim.AdamW(params, lr=rule.lr, foreach=False)
        loss = _loss(model, rows)
        loss.backward()
        opt.step()
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    state = model.state_dict()
    w1 = {n: state[n].detach().to(names[n].dtype).contiguous() for n in names}
    w1_digest = tensors_digest(w1)
    record = StepRecord(final, rule, w0_digest, tok_digest, w1_digest, float(loss.detach()))
    if final.is_dir() and _held(final) == w1_digest:
        return record
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".one-step-", dir=root))
    try:
        for file in sorted(w0.glob("*.json")):
            if not file.name.endswith(".index.json"):
                shutil.copyfile(file, tmp / file.name)
        for file in sorted(w0.glob("tokenizer*")) + sorted(w0.glob("*.model")):
            if file.is_file() and not (tmp / file.name).exists():
                shutil.copyfile(file, tmp / file.name)
        publish_bytes(tmp, WEIGHTS, tensor_parts(w1, {"xconf": record.pre_update_state}))
        if final.exists():
            shutil.rmtree(final)  # not the recorded W1 (checked above): replaced whole
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process published the same step first: its W1 is taken when it holds
            # the recorded digest (the step is a function of W0, the rule and the tokens).
            if not (final.is_dir() and _held(final) == w1_digest):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _held(path: Path) -> str | None:
    from safetensors.torch import load_file

    try:
        return tensors_digest(load_file(str(path / WEIGHTS)))
    except (OSError, ValueError, RuntimeError):
        return None
