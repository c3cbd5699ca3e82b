"""Bounded readers of npz and Parquet bytes: what a file declares is checked before it is
decoded, so a small file cannot make xconf allocate gigabytes.

* npz (:func:`npz_arrays`): no pickle; each member's ``.npy`` header is read first, and its
  declared shape times its item size must be exactly the member's size (a 2 MB archive
  declaring 2 GiB of ids is refused before the array is allocated: numpy's own reader
  allocates the declared array first), the members' sizes together within the budget.
* Parquet (:func:`parquet_table`): the metadata's row and value counts (what decoding
  makes: a 1 KiB file of run-length-encoded zeros decodes to gigabytes) within the budget,
  then the columns decoded batch by batch, the running size checked after each.

Every refusal is an :class:`~xconf.errors.ArtifactError`: ``columnar.too_large`` or
``columnar.malformed``; callers give it their own code. numpy and pyarrow are imported
when called.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from xconf.errors import ArtifactError

MAX_MEMBERS = 4096
# Bytes a Parquet leaf value decodes to, by physical type (variable-length values count
# their offsets; their bytes are bounded by the page sizes).
_PHYSICAL = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def _too_large(message: str, where: str) -> ArtifactError:
    return ArtifactError("columnar.too_large", message, where)


def npz_arrays(data: bytes | bytearray, where: str, budget: int) -> dict[str, Any]:
    """Every array of an npz archive by name (``x.npy`` is ``x``), without pickle."""
    import zipfile

    import numpy as np
    from numpy.lib import format as npy

    out: dict[str, Any] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            if len(members) > MAX_MEMBERS:
                raise _too_large(f"{len(members)} arrays, more than {MAX_MEMBERS}", where)
            names = [m.filename for m in members]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:  # the archive would be read as the last of the two
                raise ArtifactError(
                    "columnar.malformed", f"the archive holds {twice[0][:200]!r} twice", where
                )
            declared = sum(m.file_size for m in members)
            if declared > budget:
                raise _too_large(
                    f"the arrays take {declared} bytes, more than the {budget} allowed", where
                )
            for member in members:
                name = member.filename.removesuffix(".npy")
                stream: Any
                with archive.open(member) as stream:
                    version = npy.read_magic(stream)
                    readers = {
                        (1, 0): npy.read_array_header_1_0,
                        (2, 0): npy.read_array_header_2_0,
                    }
                    if version not in readers:
                        raise ArtifactError(
                            "columnar.malformed", f"'{name}': npy format {version}", where
                        )
                    shape, fortran, dtype = readers[version](stream)
                    if dtype.hasobject:
                        raise ArtifactError(
                            "columnar.malformed", f"'{name}' holds Python objects", where
                        )
                    nbytes = math.prod(shape) * dtype.itemsize
                    if nbytes != member.file_size - stream.tell():
                        raise ArtifactError(
                            "columnar.malformed",
                            f"'{name}' declares {shape} of {dtype} ({nbytes} bytes) in "
                            f"{member.file_size - stream.tell()} bytes",
                            where,
                        )
                    raw = bytearray(nbytes)  # writable: torch takes it without a copy
                    view, done = memoryview(raw), 0
                    while done < nbytes and (got := stream.readinto(view[done:])):
                        done += got
                    if done != nbytes:
                        raise ArtifactError("columnar.malformed", f"'{name}' is short", where)
                flat = np.frombuffer(raw, dtype=dtype)
                out[name] = flat.reshape(tuple(shape), order="F" if fortran else "C")
    except ArtifactError:
        raise
    except Exception as exc:  # zipfile and numpy raise several types for a bad archive
        message = f"not a readable npz: {type(exc).__name__}: {exc}"
        raise ArtifactError("columnar.malformed", message[:500], where) from None
    return out


def parquet_table(
    data: bytes | bytearray | memoryview,
    columns: Sequence[str],
    where: str,
    budget: int,
    max_rows: int | None = None,
) -> Any:
    """``columns`` of a Parquet file as a ``pyarrow.Table``, decoded within ``budget`` bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        source = pq.ParquetFile(pa.BufferReader(memoryview(data)))
        names = source.schema_arrow.names
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # a column named twice means two things
            raise ArtifactError(
                "columnar.malformed", f"the file names the column {twice[0][:200]!r} twice", where
            )
        meta = source.metadata
        if max_rows is not None and meta.num_rows > max_rows:
            raise _too_large(f"{meta.num_rows} rows, more than {max_rows}", where)
        wanted = set(columns)
        declared = 0
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            declared += group.total_byte_size
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema.split(".")[0] in wanted:
                    width = _PHYSICAL.get(chunk.physical_type, 8)
                    declared += chunk.num_values * width + group.num_rows * 8
        if declared > budget:
            raise _too_large(
                f"its metadata declares {declared} bytes uncompressed, more than the {budget} "
                "allowed",
                where,
            )
        batches, total = [], 0
        for batch in source.iter_batches(batch_size=65536, columns=list(columns)):
            total += batch.nbytes
            if total > budget:
                raise _too_large(f"decodes to more than the {budget} bytes allowed", where)
            batches.append(batch)
        schema = source.schema_arrow
        fields = [schema.field(n) for n in columns]
        return pa.Table.from_batches(batches, schema=pa.schema(fields))
    except ArtifactError:
        raise
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        message = f"not a readable Parquet file: {type(exc).__name__}: {exc}"
        raise ArtifactError("columnar.malformed", message[:500], where) from None
