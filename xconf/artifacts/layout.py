"""The on-disk layout of an attempt (docs/artifacts.md): one source for writers and readers.

Torch-free on purpose, so the report and other readers can import it cheaply.
"""

from __future__ import annotations

SEAL_NAME = "COMPLETE"
SEAL_SCHEMA = "xconf.seal.v1"
PAYLOAD_FILES = (
    "requested.json",
    "materialized.json",
    "actual.json",
    "identity.json",
    "score_rollout.safetensors",
    "score_training.safetensors",
    "token_diffs.safetensors",
    "comparison.json",
)
