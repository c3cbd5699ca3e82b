"""Campaign 3: the native kernel cache never loads a library it did not build.

Each test plants a file in a fresh ``$XCONF_KERNEL_CACHE`` at the exact name the loader
uses: a shared library whose constructor writes a marker file, an empty file, a library
whose bytes no longer match the digest recorded beside it. The marker must never appear;
the damaged library is rebuilt (and the load says so), and a cache directory others can
write to is refused.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from xconf.ops.logprob import kernel_cache, native

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "kernels"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("XCONF_KERNEL_CACHE", str(directory))
    native._load.cache_clear()
    yield directory
    native._load.cache_clear()


def _compiler() -> str:
    found = native._compiler()
    if found is None:
        pytest.skip("no C++ compiler")
    return found


def _library_path(cache: Path) -> Path:
    return cache / f"row_partials_{native._build_key(_compiler(), 'portable')}.so"


def _plant(path: Path, marker: Path) -> None:
    source = path.parent.parent / "planted.c"
    source.write_text(PLANTED % marker)
    subprocess.run(
        [_compiler(), "-x", "c", "-shared", "-fPIC", str(source), "-o", str(path)], check=True
    )


def _works(kernel: native.NativeKernel) -> None:
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    m, _ = kernel.row_partials(x)
    assert m.tolist() == [3.0, 7.0, 11.0]


def test_planted_library_without_a_record_is_rebuilt_never_run(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "constructor-ran"
    path = _library_path(cache)
    _plant(path, marker)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        kernel = native.kernel("portable")
    assert not marker.exists()  # its constructor never ran
    assert kernel.rebuilt is not None and "no digest" in kernel.rebuilt
    assert any("rebuilt" in r.getMessage() for r in caplog.records)
    recorded = (cache / (path.name + ".sha256")).read_text().strip()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded
    _works(kernel)


def test_planted_library_under_a_valid_record_is_rebuilt_never_run(
    cache: Path, tmp_path: Path
) -> None:
    native.kernel("portable")  # a real build and its record
    native._load.cache_clear()
    marker = tmp_path / "constructor-ran"
    path = _library_path(cache)
    _plant(path, marker)  # the library swapped, the record left as it was
    kernel = native.kernel("portable")
    assert not marker.exists()
    assert kernel.rebuilt is not None and "do not match" in kernel.rebuilt
    _works(kernel)


@pytest.mark.parametrize("damage", ["empty", "truncated", "symlink"])
def test_damaged_library_is_rebuilt_and_says_so(cache: Path, tmp_path: Path, damage: str) -> None:
    first = native.kernel("portable")
    native._load.cache_clear()
    path = first.path
    # Replaced, not rewritten in place: this process has the library mapped.
    data = path.read_bytes()
    path.unlink()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[:4096])
    else:
        outside = tmp_path / "outside.so"
        outside.write_bytes(data)
        path.symlink_to(outside)
    kernel = native.kernel("portable")
    assert kernel.rebuilt is not None, damage
    assert path.is_file() and not path.is_symlink() and path.stat().st_size > 0
    _works(kernel)


def test_fifo_at_the_record_is_not_waited_on(cache: Path, tmp_path: Path) -> None:
    import os

    first = native.kernel("portable")
    native._load.cache_clear()
    record = first.path.with_name(first.path.name + kernel_cache.DIGEST_SUFFIX)
    record.unlink()
    os.mkfifo(record)  # a read of it would block forever
    kernel = native.kernel("portable")
    assert kernel.rebuilt is not None and record.is_file()
    _works(kernel)


def test_cache_directory_writable_by_others_is_refused(cache: Path, tmp_path: Path) -> None:
    marker = tmp_path / "constructor-ran"
    path = _library_path(cache)
    _plant(path, marker)
    # Whoever can write the directory can write a matching record too.
    (cache / (path.name + ".sha256")).write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    cache.chmod(0o777)
    with pytest.raises(native.NativeKernelUnavailable) as refused:
        native.kernel("portable")
    assert "writable by others" in refused.value.message and str(cache) in refused.value.message
    assert not marker.exists()
