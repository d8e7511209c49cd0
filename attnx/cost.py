"""The cost model's vocabulary: what a variant or model declares about its FLOPs and memory (no torch).

A variant declares ``Variant.cost(shape, config) -> AttentionCost`` for one attention layer and a
model declares ``ModelSpec.cost(config, shape, attend) -> Part`` for a forward, where ``attend``
gives the cost of the layer's attention; :mod:`attnx.exporter.budget` puts them together to refuse jobs
that cannot fit in memory and to report achieved FLOP rates.

FLOPs are those of ``torch.utils.flop_counter``: 2 per multiply-add of every product the
implementation runs as a matrix multiplication (``nn.Linear``, matmul/bmm, SDPA; the ONNX bodies
run the same MatMuls), at the shapes it runs them, padding included. Element-wise work (norms,
softmax exponentials, feature maps, masking) and reductions written as multiply + sum are left
out: a few percent at these sizes, so an achieved FLOP rate computed from these counts is a slight
underestimate. Memory is an upper bound in float32 of the tensors the maths may hold at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from attnx.errors import AttnxError

FLOAT_BYTES = 4
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention call: batch, query length, model width and heads; ``causal``
    self-attention, or cross-attention over ``context`` keys (None: self-attention)."""

    batch: int
    seq: int
    d_model: int
    n_heads: int
    causal: bool = False
    context: int | None = None

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def keys(self) -> int:
        return self.seq if self.context is None else self.context

    @property
    def key_tokens(self) -> int:
        return self.batch * self.keys

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclasses.dataclass(frozen=True)
class AttentionCost:
    """One layer: projection FLOPs, attention-maths FLOPs, bytes of the maths' live tensors."""

    projection_flops: int
    maths_flops: int
    working_bytes: int

    @property
    def flops(self) -> int:
        return self.projection_flops + self.maths_flops


@dataclasses.dataclass(frozen=True)
class Part:
    """A model part: FLOPs (None: some attention in it has no cost function) and working bytes."""

    flops: int | None
    working: int


# (shape, role) -> the cost of the model's attention in that role ("self" or "cross")
Attend = Callable[[Shape, str], Part]


def projections(s: Shape, queries: int, keys: int = 0) -> int:
    """FLOPs of d_model x d_model projections: ``queries`` of them over the query tokens, ``keys``
    over the keys'."""
    return 2 * s.d_model**2 * (queries * s.tokens + keys * s.key_tokens)


def dense_attention_cost(s: Shape) -> AttentionCost:
    """Attention that materialises every score: Q, O projections of the queries, K, V of the keys;
    Q K^T and P V are 2·B·H·N·M·d_h each, causal or not (every score is computed, then masked).
    Memory: two (B, H, N, M) score tensors (scores -> biased -> probabilities, each freed once used),
    three when causal (ONNX Runtime keeps one more), plus the (B, 1, N, M) mask bias. Measured at N=16384
    (d_model 256, 4 heads): softmax's default encoder peaked at 8.6 GiB in ONNX Runtime's primitive body
    against this bound's 9.0 (the standard Attention op 5.5, torch SDPA 2.3); one causal layer at 12.7
    against 13.0. Also the memory bound assumed for a variant without a cost model."""
    scores = s.batch * s.n_heads * s.seq * s.keys
    working = FLOAT_BYTES * ((3 if s.causal else 2) * scores + s.batch * s.seq * s.keys)
    return AttentionCost(projections(s, 2, 2), 2 * (2 * scores * s.head_dim), working)


def kernel_attention_cost(s: Shape, chunk_size: int, features: int) -> AttentionCost:
    """Kernelised linear attention (phi(Q) (phi(K)^T V), normalised) with F ``features`` per head,
    the causal form in chunks of C = min(chunk_size, N).

    V carries a ones column (d_h + 1 values: the normaliser comes out of the same products).
    Bidirectional: phi(K)^T V over the keys and phi(Q)(phi(K)^T V) over the queries,
    2·B·H·F·(d_h + 1)·(M + N). Causal: the sequence padded to P = C·ceil(N/C), per head
    2·P·(C·F + C·(d_h + 1) + 2·F·(d_h + 1)) for the in-chunk scores and their mix, each chunk's
    phi(K)^T V and the queries against the earlier chunks' sums. Memory: features of Q and K, V and the
    numerator, and (counted always) the chunked form's (B, H, N, C) scores and
    (B, H, N/C, F, d_h) prefix states.
    """
    b, h, dh = s.batch, s.n_heads, s.head_dim
    values = dh + 1
    chunk = max(1, min(chunk_size, s.seq))
    if s.causal:
        padded = chunk * math.ceil(s.seq / chunk)
        maths = 2 * b * h * padded * (chunk * features + chunk * values + 2 * features * values)
    else:
        maths = 2 * b * h * features * values * (s.keys + s.seq)
    live = h * features * (s.tokens + s.key_tokens) + 2 * s.tokens * s.d_model
    chunked = s.tokens * h * chunk + 2 * b * h * math.ceil(s.seq / chunk) * features * dh
    return AttentionCost(projections(s, 2, 2), maths, FLOAT_BYTES * (live + chunked))


def require_disk(needed: int, what: str, directory: Path) -> None:
    """Refuse a job that would write more than the free space of ``directory``'s filesystem (its nearest
    existing ancestor's).

    Raises:
        AttnxError: naming the estimate, the free space and the fix.
    """
    import shutil

    existing = directory.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise AttnxError(
            f"{what} writes about {needed / GiB:.1f} GiB, but {existing} has {free / GiB:.1f} GiB free; "
            "free some space or write it elsewhere (-o)"
        )


def available_memory() -> int | None:
    """What this process may still allocate: the least of ``MemAvailable`` (/proc/meminfo), its cgroup's
    ``memory.max`` less ``memory.current`` and its address-space limit (``ulimit -v``) less its size
    (None where none of them is known)."""
    found = [_meminfo(), _cgroup_headroom(), _address_space_headroom()]
    known = [value for value in found if value is not None]
    return max(0, min(known)) if known else None


def _meminfo() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_headroom() -> int | None:
    """cgroup v2: ``memory.max`` - ``memory.current`` of this process's cgroup."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        (line,) = [x for x in Path("/proc/self/cgroup").read_text().splitlines() if x.startswith("0::")]
        group = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            return int(limit) - int((group / "memory.current").read_text())
    return None


def _address_space_headroom() -> int | None:
    """``ulimit -v`` less the process's virtual size."""
    import resource

    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = _address_space_size()
    if limit == resource.RLIM_INFINITY or size is None:
        return None
    return limit - size


def _address_space_size() -> int | None:
    """The process's virtual size (VmSize of /proc/self/status)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return None


def require_memory(needed: int, what: str, fix: str, available: int | None = None) -> None:
    """Refuse a job that needs more memory than is available (unknown availability: no check).

    Raises:
        AttnxError: naming the estimate, what is available and the fix.
    """
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        raise AttnxError(
            f"{what} needs about {needed / GiB:.1f} GiB of memory, but {available / GiB:.1f} GiB is "
            f"available; {fix}"
        )
