"""Bounds of the numbers a user gives attnx (importable without torch: the CLI's options use them).

Each bound refuses a value that cannot be meant and would otherwise hang, exhaust memory or write
something a server rejects: one line naming the option and its range.
"""

from __future__ import annotations

from attnx.errors import AttnxError

# Seeds are signed 64-bit (torch.manual_seed, numpy and the manifest's JSON readers all take that).
MAX_SEED = 2**63 - 1
# Tokens one `attnx generate` call makes: a million steps of one token take hours already.
MAX_NEW_TOKENS = 1_000_000
# Threads of one ONNX Runtime session or torch runner (ORT starts them all at once; 10**6 hangs).
MAX_THREADS = 1024
# Triton: rows of one dynamically batched request, and model instances (each holds its own model copy).
MAX_BATCH = 65536
MAX_INSTANCES = 256
# A Triton model name is a directory name (most filesystems: 255 bytes); Triton logs and URLs carry it.
MAX_NAME = 128


def require_range(name: str, value: int, low: int, high: int) -> int:
    """``value`` if ``low <= value <= high``.

    Raises:
        AttnxError: naming the option and its range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AttnxError(f"{name} must be an integer in {low}..{high} (got {value!r})")
    return value
