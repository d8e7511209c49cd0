"""``attnx::FastformerAttention`` as one Triton kernel: two additive poolings, then u_i = k_global ⊙ v_i.

Per (batch, head): q_global = sum_i softmax_i(w_q·q_i · scale) q_i, then k_global the same
pooling of p_i = q_global ⊙ k_i with w_k, each one pass over the tokens with a running max
(online softmax) in float32; padded tokens' scores are *replaced* by ``MASKED_SCORE`` as in
the torch op, so a fully padded row pools uniformly. Then u_i = k_global ⊙ v_i.

A program computes both poolings of its head and writes the token blocks pid, pid + P, ...
(P = the tactic's ``PROGRAMS``): P = 1 reads each input once (O(N) per head), a larger P runs
more programs, each repeating the two O(N) poolings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import triton
import triton.language as tl

from attnx.attention import MASKED_SCORE
from attnx.kernels import Shapes, Tactic, TritonKernel, block, per_head_grid, static
from attnx.plugins.lib.tiles import load_rows

_MASKED = tl.constexpr(MASKED_SCORE)


@triton.jit
def _pool(
    x, key_padding_mask, base, batch, N, w, gate,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """sum_i softmax_i(w·y_i · scale) y_i over the tokens y_i = gate ⊙ x_i of one head: (BLOCK_D,) float32."""
    top = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros_like(w)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        tokens = load_rows(x, base, rows, N, D, BLOCK_D).to(tl.float32) * gate[None, :]
        scores = tl.sum(tokens * w[None, :], 1) * SCALE
        if key_padding_mask is not None:
            real = tl.load(key_padding_mask + batch * N + rows, mask=row_ok, other=1) != 0
            scores = tl.where(real, scores, _MASKED)
        scores = tl.where(row_ok, scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 0))
        weights = tl.exp(scores - new_top)
        rescale = tl.exp(top - new_top)
        total = total * rescale + tl.sum(weights, 0)
        acc = acc * rescale + tl.sum(weights[:, None] * tokens, 0)
        top = new_top
    return acc / total


@triton.jit
def fastformer_attention_kernel(
    q, k, v, w_q, w_k, key_padding_mask,
    H, N,
    out,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PROGRAMS: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1).to(tl.int64)
    batch, head = bh // H, bh % H
    base = bh * N * D
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    scoring_q = tl.load(w_q + head * D + dims, mask=dim_ok, other=0.0).to(tl.float32)
    scoring_k = tl.load(w_k + head * D + dims, mask=dim_ok, other=0.0).to(tl.float32)
    ones = tl.full([BLOCK_D], 1.0, tl.float32)
    global_query = _pool(q, key_padding_mask, base, batch, N, scoring_q, ones, SCALE, D, BLOCK_D, BLOCK_N)
    global_key = _pool(
        k, key_padding_mask, base, batch, N, scoring_k, global_query, SCALE, D, BLOCK_D, BLOCK_N
    )
    for token_block in range(tl.program_id(0), tl.cdiv(N, BLOCK_N), PROGRAMS):
        rows = token_block * BLOCK_N + tl.arange(0, BLOCK_N)
        values = load_rows(v, base, rows, N, D, BLOCK_D).to(tl.float32)
        tl.store(
            out + base + rows[:, None] * D + dims[None, :],
            (global_key[None, :] * values).to(out.dtype.element_ty),
            mask=(rows[:, None] < N) & dim_ok[None, :],
        )


def _scalars(shapes: Shapes) -> dict[str, Any]:
    return {"H": shapes["q"][1], "N": shapes["q"][2]}


def _constants(shapes: Shapes, attributes: Mapping[str, Any]) -> dict[str, Any]:
    d = static(shapes["q"][3], "head size")
    return {"SCALE": float(attributes["scale"]), "D": d, "BLOCK_D": block(d)}


FASTFORMER_KERNEL = TritonKernel(
    fn=fastformer_attention_kernel,
    inputs=("q", "k", "v", "w_q", "w_k", "key_padding_mask"),
    scalars=_scalars,
    constants=_constants,
    grid=per_head_grid("q"),
    tactics=(
        Tactic("one-n16", {"BLOCK_N": 16, "PROGRAMS": 1}, num_warps=2),
        Tactic("split4-n64", {"BLOCK_N": 64, "PROGRAMS": 4}, num_warps=4),
    ),
)
