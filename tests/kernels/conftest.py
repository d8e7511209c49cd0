"""Triton kernel tests run on CUDA when there is a device, else in Triton's interpreter on CPU.

The interpreter is chosen when a ``@triton.jit`` function is defined (triton reads
``TRITON_INTERPRET`` then), so it is switched on here, before any test imports a kernel module.
"""

from __future__ import annotations

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
