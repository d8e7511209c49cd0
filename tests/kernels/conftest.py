"""Triton kernel tests run on CUDA when there is a device, else in Triton's interpreter on CPU
(switched on by tests/conftest.py before anything imports triton)."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
