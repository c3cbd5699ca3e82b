"""The machine that scored: its CPU model and the instruction-set features that pick kernels.

bfloat16 (and, less often, float32) scores depend on them, not only on library versions:
vLLM's CPU backend loads one of three kernel libraries by them (``_C`` with avx512_bf16,
``_C_AVX512``, ``_C_AVX2``), oneDNN and ATen dispatch by them too. Measured on the real
default, the same bfloat16 rollout reads 553 mismatches (max 0.503) on an AMD EPYC with
avx512_bf16 and 532 (max 0.372) on the CPU the README's first table came from. So the record
is part of every attempt's environment, and with it of the execution key: a sealed attempt
made on another CPU is that machine's evidence, never reused as this one's.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# Features that change which kernels run: x86 (flag names as /proc/cpuinfo spells them) and
# aarch64 ("Features" names). Anything else in the flags leaves the scores alone.
KERNEL_FEATURES = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)
# Environment variables that lower the ISA oneDNN dispatches to (ATen's own limit,
# ATEN_CPU_CAPABILITY, is read back as torch's capability below).
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor in a /proc/cpuinfo text."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def _torch_capability() -> str:
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def machine_record(cpuinfo: str | None = None) -> dict[str, str]:
    """``cpu`` (model name), ``cpu_isa`` (the :data:`KERNEL_FEATURES` it has, space-separated),
    ``machine`` (the architecture), ``torch_cpu_capability`` (what ATen dispatches to) and any
    :data:`ISA_LIMITS` set in this process: strings, as an environment record holds them."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(errors="replace")
        except OSError:  # not Linux: no flags to read, the processor name only
            cpuinfo = ""
    model, flags = _cpuinfo(cpuinfo)
    record = {
        "cpu": model or platform.processor() or "unknown",
        "cpu_isa": " ".join(f for f in KERNEL_FEATURES if f in flags) or "none listed",
        "machine": platform.machine() or "unknown",
        "torch_cpu_capability": _torch_capability(),
    }
    record.update({name.lower(): os.environ[name] for name in ISA_LIMITS if name in os.environ})
    return record


@functools.cache
def _this_machine() -> tuple[tuple[str, str], ...]:
    return tuple(machine_record().items())


def this_machine() -> dict[str, str]:
    """:func:`machine_record` of this process, read once."""
    return dict(_this_machine())
