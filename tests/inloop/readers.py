"""Readers for what the loggers wrote, independent of the writers under test."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768  # the LevelDB log block that W&B's transaction log (.wandb) is made of


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: written here, not
    taken from the writer's library, so the framing is checked by another implementation."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tensorboard_scalars(logdir: Path) -> dict[tuple[str, int], float]:
    """Every scalar of every event file (TFRecord framing: length, crc, data, crc; both
    CRCs checked, as TensorBoard's reader checks them)."""
    from tensorboardX.proto import event_pb2

    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    out = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            head = data[offset : offset + 8]
            (length,) = struct.unpack("<Q", head)
            (head_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
            body = data[offset + 12 : offset + 12 + length]
            (body_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
            if head_crc != _masked(crc32c(head)) or body_crc != _masked(crc32c(body)):
                raise ValueError(f"{path}: a record at byte {offset} fails its CRC")
            event = event_pb2.Event.FromString(body)
            offset += 12 + length + 4
            for value in event.summary.value:
                out[(value.tag, int(event.step))] = float(value.simple_value)
    return out


def _wandb_chunks(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    offset, pending = 7, b""
    while offset + 7 <= len(data):
        left = BLOCK - offset % BLOCK
        if left < 7:  # the block's tail is padding
            offset += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            pending = chunk
        elif kind == 3:  # middle
            pending += chunk
        elif kind == 4:  # last
            yield pending + chunk


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows of an offline run, from its ``run-*.wandb`` file."""
    import json

    from wandb.proto import wandb_internal_pb2

    (log,) = run_dir.glob("run-*.wandb")
    rows = []
    for chunk in _wandb_chunks(log):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(chunk)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
