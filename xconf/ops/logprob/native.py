"""Build, cache, load and call the hand-written row-partials kernel (``native_partials.cpp``).

The source is compiled once per machine with the system C++ compiler (``$CXX``, else
``g++``, ``c++`` or ``clang++``) for the machine's own instruction set, into
``$XCONF_KERNEL_CACHE`` (default ``~/.cache/xconf/kernels``) under a name derived from the
source, the compiler, the flags and the target's ISA macros, so a changed source or a
different CPU never reuses a stale library. Publication is a rename, so concurrent
processes never load a half-written file. Beside each library its SHA-256 is recorded
(``<name>.so.sha256``, also published by a rename); a library is loaded only from a
file whose bytes (read from one descriptor, still open and still the file at that name
when it is loaded) match that record, so a planted, truncated or empty file is never
``dlopen``ed (its constructor never runs): it is rebuilt, with a warning that says so. A
cache directory that is not a directory owned by this user and writable by no one else is
refused (someone who can write it could plant a library and its record together); the
rules are :mod:`xconf.ops.logprob.kernel_cache`'s. The
library is loaded with ``ctypes``, whose
calls release the GIL: rows are split across up to ``torch.get_num_threads()`` threads,
and since every row is reduced alone the split never changes a bit.

Two variants exist: ``best`` (AVX-512 when the CPU has it, else the portable code) and
``portable`` (GCC/Clang vector extensions on any target), which tests build on AVX-512
machines too so that both are checked.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from xconf.ops.logprob.errors import LogprobValidationError
from xconf.ops.logprob.kernel_cache import (
    open_recorded,
    publish_text,
    record_path,
    unsafe_cache_dir,
)

Variant = Literal["best", "portable"]
VARIANTS: tuple[Variant, ...] = ("best", "portable")
SOURCE = Path(__file__).with_name("native_partials.cpp")
FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    # The source spells out every fused multiply-add it wants; nothing else may fuse.
    "-ffp-contract=off",
)
DEFINES: dict[Variant, tuple[str, ...]] = {"best": (), "portable": ("-DXCONF_NATIVE_GENERIC",)}
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# Below this many elements per thread, handing rows to another thread costs more than it saves.
MIN_ELEMENTS_PER_THREAD = 1 << 18
# Rows are handed out in this many chunks per thread, each thread taking the next free one:
# on a shared machine a thread that loses its core for a while leaves its rows to the
# others instead of holding up the call (a row's bits never depend on its chunk).
CHUNKS_PER_THREAD = 8
COMPILE_TIMEOUT_S = 300
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    configured = os.environ.get("XCONF_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xconf" / "kernels"


@dataclass(frozen=True)
class NativeKernel:
    """One loaded build of the kernel; ``isa`` is ``avx512`` or ``portable``."""

    path: Path
    isa: str
    _fn: Any
    _merge: Any
    # Why the cached library was rebuilt before this load (damaged, planted, unrecorded).
    rebuilt: str | None = None

    @property
    def label(self) -> str:
        """What ranks compare before a collective: builds with other code give other bits."""
        return f"native:{self.isa}:{self.path.stem}"

    def row_partials(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(max, sum exp(x - max))`` of every row of a 2-D CPU tensor.

        The rows may be strided (a column slice of a wider tensor); each row's own
        elements must be contiguous. A row whose max is -inf gives ``(-inf, 0)``.
        """
        x, code = _rows_input(x)
        rows, width = x.shape
        m, s = _outputs(rows, 2)
        self._split(
            rows,
            rows * width,
            lambda start, count: self._fn(
                _at(x, start), code, count, width, x.stride(0), _at(m, start), _at(s, start)
            ),
        )
        return m, s

    def merge_lse(self, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The LSE of every row of ``[rows, tiles]`` fp32 partials, merged in column order."""
        m = m.to(torch.float32).contiguous()
        s = s.to(torch.float32).contiguous()
        rows, tiles = m.shape
        (lse,) = _outputs(rows, 1)
        if rows:
            self._merge(m.data_ptr(), s.data_ptr(), rows, tiles, lse.data_ptr())
        return lse

    def _split(self, rows: int, elements: int, job: Any) -> None:
        """Runs ``job(start, count)`` over row ranges on up to ``torch.get_num_threads()``
        threads (ctypes releases the GIL), chunks taken first come first served; each row
        is reduced alone, so the split never changes a bit."""
        if rows == 0:
            return
        threads = max(1, min(torch.get_num_threads(), rows, elements // MIN_ELEMENTS_PER_THREAD))
        if threads == 1:
            job(0, rows)
            return
        step = -(-rows // min(rows, threads * CHUNKS_PER_THREAD))
        starts = iter(range(0, rows, step))
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    start = next(starts, None)
                if start is None:
                    return
                job(start, min(step, rows - start))

        futures = [_pool(threads - 1).submit(work) for _ in range(threads - 1)]
        try:
            work()
        finally:
            for future in futures:
                future.result()


def _rows_input(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    code = DTYPE_CODES.get(x.dtype)
    if code is None or x.dim() != 2 or x.device.type != "cpu":
        raise LogprobValidationError(
            "logprob.call.native_input",
            f"the native kernel takes 2-D CPU float32/bfloat16/float16 rows, got "
            f"{tuple(x.shape)} {x.dtype} on {x.device}",
            "logits",
        )
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return x, code


def _outputs(rows: int, count: int) -> tuple[torch.Tensor, ...]:
    """``count`` fp32 vectors of ``rows`` values, one allocation."""
    return tuple(torch.empty(count, rows, dtype=torch.float32).unbind(0))


def _at(t: torch.Tensor, row: int) -> int:
    """The address of row ``row`` of ``t`` (a vector, or a 2-D tensor with rows strided)."""
    return t.data_ptr() + row * t.stride(0) * t.element_size()


class NativeKernelUnavailable(LogprobValidationError):
    """The kernel cannot be built or loaded here; the message says why."""


def kernel(variant: Variant = "best") -> NativeKernel:
    """The loaded kernel, built on first use; raises :class:`NativeKernelUnavailable`."""
    if variant not in VARIANTS:
        raise NativeKernelUnavailable(
            "logprob.call.native_variant", f"variant must be one of {list(VARIANTS)}", "variant"
        )
    result = _load(variant)
    if isinstance(result, str):
        raise NativeKernelUnavailable("logprob.call.native_unavailable", result, "impl")
    return result


def available(variant: Variant = "best") -> bool:
    return not isinstance(_load(variant), str)


@functools.cache
def _load(variant: Variant) -> NativeKernel | str:
    """The kernel, or the reason it cannot be had (remembered for the process)."""
    compiler = _compiler()
    if compiler is None:
        return "no C++ compiler found ($CXX, g++, c++ or clang++)"
    try:
        key = _build_key(compiler, variant)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot query the compiler {compiler}: {exc}"
    directory = cache_dir()
    path = directory / f"row_partials_{key}.so"
    unsafe = unsafe_cache_dir(directory)
    if unsafe is not None:
        log.warning("native kernel not loaded: %s", unsafe)
        return unsafe
    rebuilt = None
    loaded = open_recorded(path)
    if isinstance(loaded, str):
        if loaded != "missing":
            rebuilt = f"{path} was rebuilt: {loaded}"
            log.warning("%s", rebuilt)
        reason = _compile(compiler, variant, directory, path)
        if reason is not None:
            return reason
        loaded = open_recorded(path)
        if isinstance(loaded, str):
            return f"cannot load {path} after building it: {loaded}"
    try:
        # The name must still be the file whose bytes were digested (the descriptor stays
        # open, so its inode cannot be reused). Not ``/proc/self/fd/N``: the loader matches
        # an already loaded library by that name, and descriptor numbers repeat.
        opened, named = os.fstat(loaded), os.stat(path, follow_symlinks=False)
        if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino):
            return f"cannot load {path}: it was replaced while it was checked"
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        return f"cannot load {path}: {exc}"
    finally:
        os.close(loaded)
    fn = library.xconf_row_partials
    fn.restype = None
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    merge = library.xconf_merge_lse
    merge.restype = None
    merge.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    merge.argtypes += [ctypes.c_void_p]
    library.xconf_partials_isa.restype = ctypes.c_int32
    isa = "avx512" if library.xconf_partials_isa() == 512 else "portable"
    return NativeKernel(path, isa, fn, merge, rebuilt)


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _build_key(compiler: str, variant: Variant) -> str:
    def run(*args: str) -> str:
        done = subprocess.run(
            [compiler, *args], capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout

    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    for part in (compiler, run("--version"), " ".join(FLAGS + DEFINES[variant])):
        digest.update(b"\0" + part.encode())
    # The macros -march=native defines name the instruction sets the build will use.
    macros = run("-march=native", "-dM", "-E", "-x", "c++", os.devnull)
    digest.update(b"\0" + "\n".join(sorted(macros.splitlines())).encode())
    return digest.hexdigest()[:20]


def _compile(compiler: str, variant: Variant, directory: Path, path: Path) -> str | None:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temp = tempfile.mkstemp(dir=directory, prefix=".build-", suffix=".so")
        os.close(handle)
    except OSError as exc:
        return f"cannot write the kernel cache {directory}: {exc}"
    command = [compiler, *FLAGS, *DEFINES[variant], str(SOURCE), "-o", temp]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            return f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}"
        digest = hashlib.sha256(Path(temp).read_bytes()).hexdigest()
        # The record first, then the library, each by a rename: a reader never sees a
        # library newer than its record (a concurrent builder publishes identical bytes; if
        # not, the next load finds the mismatch and rebuilds).
        publish_text(directory, record_path(path), digest + "\n")
        os.replace(temp, path)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(command)} failed: {exc}"
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


_POOL_LOCK = threading.Lock()
_POOL: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of at least ``workers`` threads (a forked child gets its own)."""
    global _POOL
    with _POOL_LOCK:
        current = _POOL
        if current is None or current[0] != os.getpid() or current[1] < workers:
            if current is not None and current[0] == os.getpid():
                current[2].shutdown(wait=False)
            current = (os.getpid(), workers, ThreadPoolExecutor(workers, "xconf-logprob"))
            _POOL = current
        return current[2]
