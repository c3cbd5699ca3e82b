"""`xconf check-model DIR`: what xconf will do with a checkpoint, in seconds, no engine built.

Prints the architecture, layers, attention and KV heads, the TP sizes vLLM allows, the
config's and the weights' dtypes, the tokenizer and its chat template, whether localize has
taps for it, and the checkpoint digest (every link named). Every check a run makes before
it writes anything runs here too (:func:`~xconf.adapters.models.local.open_checkpoint`),
so a checkpoint xconf cannot score ends with the same coded exit 2 naming file and field.
``DIR`` may be ``pretrained`` for the real pretrained default.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

PRETRAINED = "pretrained"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "check-model",
        help="say what xconf will do with a checkpoint directory (no engine is built)",
    )
    parser.add_argument(
        "dir", help=f"a Hugging Face checkpoint directory, or '{PRETRAINED}' (the default)"
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: DIR)")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow the checkpoint's own code"
    )


def _localize(root: Path, architecture: str, trust_remote_code: bool) -> str:
    """Whether localize has taps for this architecture, checked against the module tree
    transformers builds for the checkpoint (on the meta device: no weights are read)."""
    from xconf.localize import names

    try:
        names.name_map(architecture, str(root / "config.json"))
    except Exception as exc:
        return f"no: {getattr(exc, 'message', exc)}"
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(
            str(root), trust_remote_code=trust_remote_code, local_files_only=True
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code)
    except Exception as exc:
        return f"unknown (transformers could not build the module tree: {exc})"
    reason = names.can_tap(model)
    if reason is not None:
        return f"no: {reason}"
    return f"yes (tap map for {architecture}; every transformers tap module present)"


def _chat_template(tok_root: Path, tok: Any) -> str:
    template = getattr(tok, "chat_template", None)
    if not template:
        return "none (chat-message prompts cannot be rendered; plain prompts and ids only)"
    where = "chat_template.jinja" if (tok_root / "chat_template.jinja").is_file() else "tokenizer"
    first = str(template).strip().splitlines()[0][:60]
    return f"yes ({where}, {len(str(template))} chars: {first!r}…)"


def run(args: argparse.Namespace, console: Any) -> int:
    from xconf.adapters.models.checks import read_header
    from xconf.adapters.models.facts import model_facts
    from xconf.adapters.models.local import link_target, open_checkpoint, weight_files

    if args.dir == PRETRAINED:
        from xconf.adapters.models.pretrained import pretrained_checkpoint

        root = pretrained_checkpoint()
    else:
        root = Path(args.dir).expanduser()
    trust = bool(args.trust_remote_code)
    facts = model_facts(root, trust) if (root / "config.json").exists() else None
    if facts is not None:
        rows = [
            ("architecture", f"{facts.architecture} (model_type {facts.model_type})"),
            ("layers", str(facts.num_layers)),
            (
                "heads",
                f"{facts.num_heads} attention, {facts.num_kv_heads} KV, size {facts.head_dim}",
            ),
            ("hidden / vocab", f"{facts.hidden_size} / {facts.vocab_size}"),
            ("tied embeddings", "yes" if facts.tied_embeddings else "no"),
            ("TP sizes", ", ".join(map(str, facts.tp_sizes))),
            ("transformers", "has the class" if facts.transformers_class else "no class"),
            ("vLLM", "has the architecture" if facts.vllm_class else "no such architecture"),
            ("vLLM CPU attention", facts.cpu_head_reason() or "head size supported"),
        ]
        for key, value in rows:
            console.print(f"{key:<20} {value}")
    # Every check a run makes before it writes anything (raises the run's own coded error).
    record = open_checkpoint(root, args.tokenizer, trust_remote_code=trust)
    facts = facts or model_facts(record.path, trust)
    weight_dtypes = sorted(
        {dtype for f in weight_files(Path(record.path)) for dtype, _ in read_header(f).values()}
    )
    from transformers import AutoTokenizer

    tok_root = Path(record.tokenizer_path or record.path)
    tok = AutoTokenizer.from_pretrained(
        str(tok_root), trust_remote_code=trust, local_files_only=True
    )
    links = [
        f"{p.name} -> {link_target(p)}"
        for p in sorted(Path(record.path).iterdir())
        if link_target(p)
    ]
    rows = [
        ("dtypes", f"config {facts.config_dtype or 'unset'}; weights {', '.join(weight_dtypes)}"),
        (
            "tokenizer",
            f"{type(tok).__name__}, {len(tok)} tokens, eos {tok.eos_token!r} "
            f"(id {tok.eos_token_id}), from {tok_root}",
        ),
        ("chat template", _chat_template(tok_root, tok)),
        ("localize", _localize(Path(record.path), facts.architecture, trust)),
        ("checkpoint", f"sha256:{record.checkpoint_sha256}"),
        ("links", "; ".join(links) if links else "none"),
        (
            "xconf",
            "can score it ("
            + (
                "xconf-run +experiment=s2_smollm2 runtime=vllm_hf"
                if args.dir == PRETRAINED
                else f"runtime=vllm_hf runtime.model.path={record.path}"
            )
            + ")",
        ),
    ]
    for key, value in rows:
        console.print(f"{key:<20} {value}")
    return 0
