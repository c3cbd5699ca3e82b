"""Reliability campaigns: one intra-op thread (small shared CI machines)."""

from __future__ import annotations

import os

import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
