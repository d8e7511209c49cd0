"""``attnx::SoftmaxAttention`` as one Triton kernel: flash attention (online softmax over key blocks).

A program owns BLOCK_M queries of one (batch, head) and streams the keys in blocks of BLOCK_N (of key
head head // GROUP: keys and values may have fewer heads than the queries, grouped-query attention),
keeping the running row max m, the sum l of exp(s - m) and the weighted sum of values, all in
float32. Scores are q·k * scale plus the op's bias: ``MASKED_SCORE`` (-65504) added for padded
keys, -inf for keys after the query's bottom-right causal position (key j <= i + n_keys - n_q).
So a fully padded row is a softmax over its (all padded) keys, as in the torch op, and a row
that sees no key at all (causal, more queries than keys) is 0, as torch's SDPA returns.
Causal programs stop streaming at their last query's position.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from attnx.attention import MASKED_SCORE
from attnx.kernels import Shapes, Tactic, TritonKernel, block, query_key_scalars, row_block_grid, static
from attnx.plugins.lib.tiles import load_rows

_MASKED = tl.constexpr(MASKED_SCORE)


@triton.jit
def softmax_attention_kernel(
    q, k, v, key_padding_mask,
    H, N_Q, N_K, GROUP,
    out,
    CAUSAL: tl.constexpr, SCALE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1).to(tl.int64)
    batch = bh // H
    kv = bh // GROUP  # (batch * H + head) // GROUP = batch * kv heads + head // GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    vdims = tl.arange(0, BLOCK_DV)
    q_tile = load_rows(q, bh * N_Q * D, rows, N_Q, D, BLOCK_D)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    offset = N_K - N_Q
    end = N_K
    if CAUSAL:
        end = tl.minimum(N_K, (tl.program_id(0) + 1) * BLOCK_M + offset)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < N_K
        k_tile = load_rows(k, kv * N_K * D, cols, N_K, D, BLOCK_D)
        scores = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee").to(tl.float32) * SCALE
        if key_padding_mask is not None:
            real = tl.load(key_padding_mask + batch * N_K + cols, mask=col_ok, other=1) != 0
            scores += tl.where(real, 0.0, _MASKED)[None, :]
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        scores = tl.where(visible, scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row that has seen nothing yet
        weights = tl.exp(scores - shift[:, None])
        rescale = tl.exp(top - shift)
        v_tile = load_rows(v, kv * N_K * DV, cols, N_K, DV, BLOCK_DV)
        total = total * rescale + tl.sum(weights, 1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v_tile.dtype), v_tile, input_precision="ieee")
        top = new_top
    result = tl.where(total[:, None] > 0, acc / tl.where(total > 0, total, 1.0)[:, None], 0.0)
    tl.store(
        out + bh * N_Q * DV + rows[:, None] * DV + vdims[None, :],
        result.to(out.dtype.element_ty),
        mask=(rows < N_Q)[:, None] & (vdims[None, :] < DV),
    )


def _scalars(shapes: Shapes) -> dict[str, Any]:
    """H, N_Q, N_K and GROUP: query heads per key/value head."""
    return {**query_key_scalars(shapes), "GROUP": shapes["q"][1] // shapes["k"][1]}


def _constants(shapes: Shapes, attributes: dict) -> dict[str, object]:
    d, dv = static(shapes["q"][3], "head size"), static(shapes["v"][3], "value head size")
    return {
        "CAUSAL": bool(attributes["causal"]),
        "SCALE": float(attributes["scale"]),
        "D": d,
        "DV": dv,
        "BLOCK_D": block(d),
        "BLOCK_DV": block(dv),
    }


SOFTMAX_KERNEL = TritonKernel(
    fn=softmax_attention_kernel,
    inputs=("q", "k", "v", "key_padding_mask"),
    scalars=_scalars,
    constants=_constants,
    grid=row_block_grid("q"),
    tactics=(
        Tactic("m16n16", {"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=2),
        Tactic("m64n32", {"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4),
    ),
)
