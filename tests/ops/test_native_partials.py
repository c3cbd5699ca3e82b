"""The hand-written row-partials kernel: accuracy, special values, bits, build cache.

Both builds are checked on this machine: ``best`` (AVX-512 where the CPU has it) and
``portable`` (the vector-extension code every other CPU runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.bitwise import bits
from xconf.ops.logprob import kernel_cache, native
from xconf.ops.logprob.impls import resolve_impl

VARIANTS = native.VARIANTS
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Around the 16-lane vector, the 32-element exp step and the 64-element max step.
WIDTHS = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 2374)
NEG_INF, POS_INF, NAN = float("-inf"), float("inf"), float("nan")


def _reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xd = x.double()
    m = xd.amax(-1)
    shift = torch.where(m == NEG_INF, 0.0, m)
    return m, torch.exp(xd - shift[:, None]).sum(-1)


def _rows(rows: int, width: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 2, rows)[:, None]  # from nearly flat rows to one-hot ones
    return (torch.randn(rows, width, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_partials_match_float64(variant: native.Variant, dtype: torch.dtype) -> None:
    kernel = native.kernel(variant)
    for width in WIDTHS:
        x = _rows(29, width, dtype, seed=width)
        m, s = kernel.row_partials(x)
        ref_m, ref_s = _reference(x)
        assert m.dtype == s.dtype == torch.float32
        assert torch.equal(m.double(), ref_m), width  # the max is exact
        relative = ((s.double() - ref_s) / ref_s).abs().max().item()
        assert relative <= 1e-6, (width, relative)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(variant: native.Variant, dtype: torch.dtype) -> None:
    kernel = native.kernel(variant)
    x = _rows(6, 37, dtype)
    x[0] = NEG_INF  # the identity partial, exactly
    x[1, ::2] = NEG_INF  # masked columns contribute nothing
    x[2, 3] = NAN
    x[3, 36] = POS_INF
    x[4, :] = -1e4 if dtype == torch.float16 else -1e30  # far below any exp range
    x[4, 5] = 0.0
    m, s = kernel.row_partials(x)
    assert m[0] == NEG_INF and bits(s[:1]).item() == 0
    ref_m, ref_s = _reference(x[1:2])
    assert m[1] == ref_m.item() and abs(s[1].item() / ref_s.item() - 1) <= 1e-6
    assert torch.isnan(s[2]) and torch.isnan(s[3])
    assert m[4] == 0.0 and s[4] == pytest.approx(1.0, rel=1e-7)
    assert torch.isfinite(s[5])


@pytest.mark.parametrize("variant", VARIANTS)
def test_row_bits_do_not_depend_on_batch_offset_or_threads(variant: native.Variant) -> None:
    kernel = native.kernel(variant)
    width = 2374
    wide = _rows(300, width + 7, torch.float32, seed=5)
    x = wide[:, 3 : 3 + width]  # strided rows starting off any alignment
    ref_m, ref_s = kernel.row_partials(x.contiguous())
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            m, s = kernel.row_partials(x)
            assert torch.equal(bits(m), bits(ref_m)) and torch.equal(bits(s), bits(ref_s))
    finally:
        torch.set_num_threads(before)
    for start, size in ((0, 1), (17, 1), (40, 63), (250, 50)):
        m, s = kernel.row_partials(x[start : start + size])
        assert torch.equal(bits(s), bits(ref_s[start : start + size])), (start, size)
        assert torch.equal(bits(m), bits(ref_m[start : start + size])), (start, size)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pipelined_rows_equal_rows_reduced_alone(
    variant: native.Variant, dtype: torch.dtype
) -> None:
    """A call reduces row i + 1's max while it reduces row i's exps: every row's bits must
    still be those of the row alone, also next to identity, NaN and one-hot rows."""
    kernel = native.kernel(variant)
    for width in WIDTHS:
        x = _rows(9, width, dtype, seed=width)
        x[1] = NEG_INF  # an identity row: its exp pass is skipped, the next max runs alone
        x[3, 0] = NAN
        x[5] = -1e4 if dtype == torch.float16 else -1e30
        x[5, width // 2] = 0.0
        x[6, width - 1] = POS_INF
        m, s = kernel.row_partials(x)
        for i in range(x.shape[0]):
            alone_m, alone_s = kernel.row_partials(x[i : i + 1].clone())
            assert torch.equal(bits(m[i : i + 1]), bits(alone_m)), (width, i)
            assert torch.equal(bits(s[i : i + 1]), bits(alone_s)), (width, i)


def test_best_and_portable_builds_agree_within_tolerance() -> None:
    x = _rows(64, 2374, torch.float32, seed=9)
    _, best = native.kernel("best").row_partials(x)
    _, portable = native.kernel("portable").row_partials(x)
    assert ((best.double() - portable.double()) / portable.double()).abs().max() <= 1e-6


def test_bad_input_names_the_problem() -> None:
    kernel = native.kernel()
    with pytest.raises(native.LogprobValidationError) as err:
        kernel.row_partials(torch.zeros(2, 3, dtype=torch.float64))
    assert err.value.code == "logprob.call.native_input"
    with pytest.raises(native.LogprobValidationError) as err:
        kernel.row_partials(torch.zeros(3))
    assert err.value.code == "logprob.call.native_input"
    with pytest.raises(native.NativeKernelUnavailable) as unknown:
        native.kernel("avx9000")  # type: ignore[arg-type]
    assert unknown.value.code == "logprob.call.native_variant"


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv("XCONF_KERNEL_CACHE", str(tmp_path / "kernels"))
    native._load.cache_clear()
    yield tmp_path / "kernels"
    native._load.cache_clear()


def test_build_is_cached_and_published_whole(fresh_loader: Path) -> None:
    first = native.kernel("portable")
    built = sorted(fresh_loader.iterdir())
    record = first.path.with_name(first.path.name + kernel_cache.DIGEST_SUFFIX)
    assert built == [first.path, record] and first.isa == "portable"  # no temporary left
    assert first.rebuilt is None
    stamp = first.path.stat().st_mtime_ns
    native._load.cache_clear()
    again = native.kernel("portable")
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp


def test_without_a_compiler_native_is_refused_and_auto_falls_back(
    fresh_loader: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "_compiler", lambda: None)
    with pytest.raises(native.NativeKernelUnavailable) as err:
        native.kernel()
    assert err.value.code == "logprob.call.native_unavailable"
    assert "compiler" in err.value.message
    assert resolve_impl("auto").label == "compiled"
    with pytest.raises(native.NativeKernelUnavailable):
        resolve_impl("native")
    assert not fresh_loader.exists()


def test_a_failing_compile_is_reported_and_leaves_nothing(
    fresh_loader: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    with pytest.raises(native.NativeKernelUnavailable) as err:
        native.kernel()
    assert "failed" in err.value.message
    assert list(fresh_loader.iterdir()) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_merge_lse_matches_float64_and_handles_special_rows(variant: native.Variant) -> None:
    """The deterministic merge (partials in column order to the LSE) and its edge rows."""
    kernel = native.kernel(variant)
    for tiles in (1, 5, 16, 17, 64, 100):
        x = _rows(23, tiles * 40, torch.float32, seed=tiles)
        m, s = kernel.row_partials(x.view(23 * tiles, 40))
        lse = kernel.merge_lse(m.view(23, tiles), s.view(23, tiles))
        ref = torch.logsumexp(x.double(), -1)
        assert lse.dtype == torch.float32
        assert ((lse.double() - ref).abs() / ref.abs().clamp(min=1)).max() <= 2e-6, tiles
    m = torch.tensor([[NEG_INF, NEG_INF], [0.0, NEG_INF], [NAN, 1.0], [1.0, 2.0]])
    s = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, NAN]])
    lse = kernel.merge_lse(m, s)
    assert lse[0] == NEG_INF and abs(lse[1].item()) <= 1e-7  # the kernel's exp(0) is 1 - 6e-8
    assert torch.isnan(lse[2:]).all()
