"""The machine record: the CPU model and the ISA features that pick kernels, from /proc/cpuinfo."""

from __future__ import annotations

import pytest

from xconf.runtime.machine import machine_record, this_machine

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu sse sse2 avx f16c avx2 avx512f avx512dq avx512_bf16 avx512_vnni sha_ni

processor\t: 1
model name\t: (a second processor, never read)
flags\t\t: fpu
"""
SAPPHIRE = (
    "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n"
)
HASWELL = "model name\t: Intel(R) Xeon(R) CPU E5-2680 v3\nflags\t\t: sse4_2 avx avx2 fma\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd aes sve sve2 bf16 i8mm\nCPU part\t: 0xd4f\n"


@pytest.mark.parametrize(
    ("text", "cpu", "isa"),
    [
        (EPYC, "AMD EPYC 9654 96-Core Processor", "avx2 avx512f avx512_vnni avx512_bf16"),
        (
            SAPPHIRE,
            "Intel(R) Xeon(R) Platinum 8480+",
            "avx2 avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8",
        ),
        (HASWELL, "Intel(R) Xeon(R) CPU E5-2680 v3", "avx2"),
        (GRAVITON, None, "asimd sve sve2 bf16 i8mm"),
    ],
    ids=["zen4", "sapphire-rapids", "haswell", "graviton3"],
)
def test_the_kernel_picking_features_are_read_from_cpuinfo(text, cpu, isa, monkeypatch) -> None:
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    record = machine_record(text)
    assert record["cpu_isa"] == isa
    if cpu is not None:  # aarch64's cpuinfo names no model: the platform's processor name
        assert record["cpu"] == cpu
    assert set(record) == {"cpu", "cpu_isa", "machine", "torch_cpu_capability"}
    assert all(isinstance(v, str) and v for v in record.values())


def test_an_isa_limit_in_the_environment_is_recorded(monkeypatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine_record(HASWELL)["onednn_max_cpu_isa"] == "AVX2"


def test_no_cpuinfo_still_names_a_machine() -> None:
    record = machine_record("")
    assert record["cpu_isa"] == "none listed" and record["cpu"]


def test_this_machine_is_read_once_and_handed_out_as_copies() -> None:
    first = this_machine()
    first["cpu"] = "edited"
    assert this_machine()["cpu"] != "edited"
